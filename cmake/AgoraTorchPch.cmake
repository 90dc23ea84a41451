# One precompiled <torch/torch.h> for every target that compiles against libtorch.
#
# Parsing libtorch's headers is most of a torch translation unit's cost (a 54 s file takes 27 s
# with the header precompiled, GCC 12 on 2 cores), and a fresh build has about seventy such
# files. A single header is built once, in agora_torch_pch, and every torch target reuses it;
# the targets share one set of flags (agora_target_defaults), which GCC checks (-Winvalid-pch,
# an error under -Werror) before it trusts the header.
#
# AGORA_TORCH_PCH=OFF builds without it (for a compiler or a tool that cannot use one).
option(AGORA_TORCH_PCH "Precompile libtorch's headers once for all torch targets" ON)

# Which of a target's direct links make it a torch target: libtorch itself, or a library of
# ours that carries libtorch in its interface.
set(AGORA_TORCH_LINKS ${TORCH_LIBRARIES} agora_model agora_train agora_optim agora_pipeline
                      agora_peer)

function(agora_collect_targets dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    agora_collect_targets(${sub} sub_targets)
    list(APPEND targets ${sub_targets})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# Call once, after every target is declared.
function(agora_precompile_torch_headers)
  if(NOT AGORA_WITH_TORCH OR NOT AGORA_TORCH_PCH)
    return()
  endif()
  add_library(agora_torch_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  agora_target_defaults(agora_torch_pch)
  target_link_libraries(agora_torch_pch PUBLIC agora_config agora_core ${TORCH_LIBRARIES})
  target_precompile_headers(agora_torch_pch PRIVATE <torch/torch.h>)
  agora_collect_targets(${PROJECT_SOURCE_DIR} targets)
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|EXECUTABLE)$" OR
       target STREQUAL "agora_torch_pch")
      continue()
    endif()
    get_target_property(links ${target} LINK_LIBRARIES)
    foreach(link ${links})
      if(link IN_LIST AGORA_TORCH_LINKS)
        target_precompile_headers(${target} REUSE_FROM agora_torch_pch)
        break()
      endif()
    endforeach()
  endforeach()
endfunction()
