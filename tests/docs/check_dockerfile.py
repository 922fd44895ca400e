#!/usr/bin/env python3
"""Checks docker/Dockerfile as far as possible without a Docker engine.

- it parses: known instructions, FROM first (after ARGs), exec-form JSON valid;
- every COPY/ADD source exists in the build context (the repository root);
- every script a RUN invokes exists in the repository, was copied into the
  image, and is executable or run through bash/sh;
- hadolint, when installed (otherwise says it was skipped).
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
INSTRUCTIONS = {"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
                "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}
EXEC_FORM = {"CMD", "ENTRYPOINT", "SHELL"}


def logical_lines(text):
    """(line number, instruction, arguments), joining continuation lines and dropping comments."""
    current, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not current:
            start = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, arguments = current.partition(" ")
        yield start, keyword, arguments.strip()
        current = ""
    if current:
        yield start, "", current


def main():
    errors = []
    with open(DOCKERFILE) as f:
        lines = list(logical_lines(f.read()))
    if not lines:
        errors.append("empty Dockerfile")
    copied = []  # build-context paths copied into the image
    seen_from = False
    for number, keyword, arguments in lines:
        where = f"docker/Dockerfile:{number}"
        upper = keyword.upper()
        if upper not in INSTRUCTIONS:
            errors.append(f"{where}: unknown instruction '{keyword}' (a continuation line without '\\'?)")
            continue
        if keyword != upper:
            errors.append(f"{where}: write instructions in capitals: {keyword}")
        if not seen_from and upper not in ("ARG", "FROM"):
            errors.append(f"{where}: {upper} before the first FROM")
        seen_from = seen_from or upper == "FROM"
        if not arguments:
            errors.append(f"{where}: {upper} without arguments")
            continue
        if upper in EXEC_FORM and arguments.startswith("["):
            try:
                value = json.loads(arguments)
                if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                    raise ValueError("not a list of strings")
            except ValueError as error:
                errors.append(f"{where}: {upper} exec form is not a JSON list of strings: {error}")
        if upper in ("COPY", "ADD"):
            flags = [w for w in shlex.split(arguments) if w.startswith("--")]
            words = [w for w in shlex.split(arguments) if not w.startswith("--")]
            if any(f.startswith("--from") for f in flags):
                continue  # from another stage, not the build context
            if len(words) < 2:
                errors.append(f"{where}: {upper} needs a source and a destination")
                continue
            for source in words[:-1]:
                if not os.path.exists(os.path.join(ROOT, source)):
                    errors.append(f"{where}: {upper} source '{source}' does not exist in the build context {ROOT}")
                copied.append(os.path.normpath(source))
        if upper == "RUN":
            words = shlex.split(arguments.replace("&&", " && ").replace(";", " ; "))
            for i, word in enumerate(words):
                if not word.endswith(".sh"):
                    continue
                path = os.path.join(ROOT, word)
                via_shell = i > 0 and words[i - 1] in ("bash", "sh")
                if not os.path.isfile(path):
                    errors.append(f"{where}: RUN invokes '{word}', which is not in the repository")
                elif not via_shell and not os.access(path, os.X_OK):
                    errors.append(f"{where}: RUN invokes '{word}', which is not executable: run it with bash")
                relative = os.path.normpath(word)
                if not any(relative == c or relative.startswith(c + os.sep) or c == "." for c in copied):
                    errors.append(f"{where}: RUN invokes '{word}' before any COPY brought it into the image")
    if not any(k.upper() == "ENTRYPOINT" for _, k, _ in lines):
        errors.append("docker/Dockerfile: no ENTRYPOINT (ddprun)")

    hadolint = shutil.which("hadolint")
    if hadolint:
        result = subprocess.run([hadolint, DOCKERFILE], capture_output=True, text=True)
        if result.returncode != 0:
            errors.append("hadolint:\n" + result.stdout + result.stderr)
        else:
            print("check_dockerfile: hadolint passed")
    else:
        print("check_dockerfile: hadolint SKIPPED: not installed (only the built-in checks ran)")

    if errors:
        print("check_dockerfile: FAILED")
        for error in errors:
            print("  " + error)
        return 1
    print(f"check_dockerfile: {len(lines)} instructions parsed; COPY sources and invoked scripts exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
