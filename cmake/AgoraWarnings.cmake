# Project code builds with warnings as errors; third-party headers come in through imported
# targets, whose include directories CMake treats as system includes, so theirs do not count.
function(agora_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  # Members declared GUARDED_BY (core/mutex.h) are checked in the clang builds (fuzz, sanitizers).
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/src)
endfunction()
