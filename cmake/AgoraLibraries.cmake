# A folder whose sources split into a torch-free library and a libtorch one (optim: the payload
# codec and the strategies; peer: the network side and the round loop):
#
#   agora_split_library(TORCH_FREE <target> SOURCES <file.cc>... [TORCH_FREE_LINKS <args>...]
#                       TORCH <target> [TORCH_LINKS <args>...])
#
# builds TORCH_FREE from the named files always, and TORCH from every other .cc of the folder
# where libtorch is (AGORA_WITH_TORCH), linked to TORCH_FREE and libtorch. The *_LINKS arguments
# go to target_link_libraries as they are (PUBLIC, PRIVATE and the libraries).
function(agora_split_library)
  cmake_parse_arguments(ARG "" "TORCH_FREE;TORCH" "SOURCES;TORCH_FREE_LINKS;TORCH_LINKS" ${ARGN})
  add_library(${ARG_TORCH_FREE} STATIC ${ARG_SOURCES})
  agora_target_defaults(${ARG_TORCH_FREE})
  target_link_libraries(${ARG_TORCH_FREE} ${ARG_TORCH_FREE_LINKS})
  if(AGORA_WITH_TORCH)
    file(GLOB torch_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
    list(TRANSFORM ARG_SOURCES PREPEND ${CMAKE_CURRENT_SOURCE_DIR}/ OUTPUT_VARIABLE torch_free)
    list(REMOVE_ITEM torch_sources ${torch_free})
    add_library(${ARG_TORCH} STATIC ${torch_sources})
    agora_target_defaults(${ARG_TORCH})
    target_link_libraries(${ARG_TORCH} PUBLIC ${ARG_TORCH_FREE} ${TORCH_LIBRARIES})
    target_link_libraries(${ARG_TORCH} ${ARG_TORCH_LINKS})
  endif()
endfunction()
