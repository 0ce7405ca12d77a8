# cmake/check_layers.cmake: fails the build when a file of one llmc layer includes a header of a layer it does not
# depend on. Run by the build (llmc/CMakeLists.txt) as
#   cmake -DLAYER=<name> -DALLOWED="<layer;layer;...>" -DFILES="<file;file;...>" -DSTAMP=<file> -P check_layers.cmake
# ALLOWED is the layer itself and the transitive closure of the dependencies declared in llmc/CMakeLists.txt. Every
# `#include "llmc/<layer>/..."` of FILES must name an allowed layer; anything else is reported with the file, the line
# and the fix, and the stamp file is not written.
include("${SPEC}")
cmake_minimum_required(VERSION 3.24)
set(violations "")
foreach(file IN LISTS FILES)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"llmc/")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"llmc/([a-z_0-9]+)/" _ "${line}")
    set(target "${CMAKE_MATCH_1}")
    if(target STREQUAL "")
      string(APPEND violations "\n  ${file}: ${line}\n    (every llmc header lives in a layer folder: llmc/<layer>/...)")
    elseif(NOT target IN_LIST ALLOWED)
      string(APPEND violations "\n  ${file}: ${line}\n    (layer '${LAYER}' may include only: ${ALLOWED})")
    endif()
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR "llmc layering violation in layer '${LAYER}':${violations}\n"
                      "Move the code to a layer that may depend on what it uses, or declare the dependency in "
                      "llmc/CMakeLists.txt if the design allows it (README: \"What is inside\").")
endif()
file(WRITE "${STAMP}" "ok\n")
