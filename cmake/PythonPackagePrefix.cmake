# ddp_python_package_prefix(<module> <variable>): the directory of a python3
# package such as nvidia.nccl or nvidia.cudnn (where PyTorch wheels keep the
# libraries they load at run time), or "" when there is none.
function(ddp_python_package_prefix module variable)
  set(_prefix "")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import ${module} as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _prefix
      OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET)
  endif()
  set(${variable} "${_prefix}" PARENT_SCOPE)
endfunction()
