#!/usr/bin/env python3
"""The library's boundary, as docs/architecture.md states it.

1. No example or benchmark is compiled with libddp/ on its include path: they
   include only <ddp/...>, as programs outside the project do.
2. libddp.so exports only what include/ddp/ declares: every exported symbol
   of namespace ddp names an entity that a public header names.

Usage: check_boundary.py BUILD_DIR SOURCE_DIR. Exits 1 listing what breaks a rule.
"""

import json
import pathlib
import re
import shlex
import subprocess
import sys

# Namespaces that hold public entities; the first name after them is the
# entity a symbol belongs to.
NAMESPACES = {"ddp", "detail", "float8", "checkpoint", "comm_hooks", "optim"}
SYMBOL_PREFIXES = ("typeinfo name for ", "typeinfo for ", "vtable for ", "VTT for ", "guard variable for ",
                   "non-virtual thunk to ", "virtual thunk to ")


def include_dirs(command):
    words = shlex.split(command)
    for i, word in enumerate(words):
        for flag in ("-I", "-isystem", "-iquote"):
            if word == flag and i + 1 < len(words):
                yield words[i + 1]
            elif word.startswith(flag) and len(word) > len(flag):
                yield word[len(flag):]


def check_include_paths(build, source):
    internal = (source / "libddp").resolve()
    outside = [source / "examples", source / "benchmarks"]
    problems = []
    for entry in json.loads((build / "compile_commands.json").read_text()):
        file = pathlib.Path(entry["directory"], entry["file"]).resolve()
        if not any(file.is_relative_to(folder.resolve()) for folder in outside):
            continue
        command = entry.get("command") or shlex.join(entry["arguments"])
        for directory in include_dirs(command):
            path = pathlib.Path(entry["directory"], directory).resolve()
            if path == internal or path.is_relative_to(internal):
                problems.append(f"{file.relative_to(source)} is compiled with {directory} on its include path")
    return problems


def entity(symbol):
    """The first name after the ddp namespaces, or None for another namespace."""
    for prefix in SYMBOL_PREFIXES:
        if symbol.startswith(prefix):
            symbol = symbol[len(prefix):]
    symbol = re.sub(r"\[abi:[a-z0-9]+\]", "", symbol)
    # Drop a return type ("ddp::Report ddp::float8::...") and the parameters.
    name = re.split(r"[(<]", symbol, maxsplit=1)[0].split(" ")[-1]
    parts = name.split("::")
    if parts[0] != "ddp":
        return None
    for part in parts:
        if part not in NAMESPACES:
            return part
    return parts[-1]


def check_exports(build, source):
    libraries = sorted((build / "libddp").glob("libddp.so*"))
    if not libraries:
        return [f"no libddp.so under {build / 'libddp'}"]
    out = subprocess.run(["nm", "-DC", "--defined-only", str(libraries[0])], check=True, capture_output=True,
                         text=True).stdout
    public = "\n".join(p.read_text() for p in sorted((source / "include" / "ddp").glob("*.h")))
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", public))
    problems = []
    exported = 0
    for line in out.splitlines():
        symbol = line.split(" ", 2)[-1]
        name = entity(symbol)
        if name is None:
            continue
        exported += 1
        if name not in names:
            problems.append(f"libddp.so exports {symbol}, which no public header names")
    print(f"{libraries[0].name}: {exported} exported symbols of namespace ddp, all named by include/ddp/"
          if not problems else f"{libraries[0].name}: {len(problems)} of {exported} exports are not public")
    return problems


def main():
    build, source = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
    problems = check_include_paths(build, source) + check_exports(build, source)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
