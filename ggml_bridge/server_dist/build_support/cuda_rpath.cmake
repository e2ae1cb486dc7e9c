# gb_cuda_rpath(<out> <major>): ";$ORIGIN/../../<dir>" for each folder where NVIDIA's runtime wheels of CUDA <major>
# put their libraries (cuda_runtime.json beside this file), as seen from ggml_bridge_server/{bin,lib}: two levels up
# is site-packages. A major the table does not name is a fatal error.
function(gb_cuda_rpath out major)
    file(READ "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/cuda_runtime.json" table)
    string(JSON n ERROR_VARIABLE err LENGTH "${table}" "${major}" libdirs)
    if (err)
        message(FATAL_ERROR "ggml-bridge-server: build_support/cuda_runtime.json names no runtime wheels for CUDA "
                            "${major}; use a CUDA 12 or 13 toolkit")
    endif()
    set(rpath "")
    math(EXPR last "${n} - 1")
    foreach (i RANGE ${last})
        string(JSON d GET "${table}" "${major}" libdirs ${i})
        string(APPEND rpath ";$ORIGIN/../../${d}")
    endforeach()
    set(${out} "${rpath}" PARENT_SCOPE)
endfunction()

# gb_cuda_libs(<out> <major>): the sonames NVIDIA's runtime wheels of CUDA <major> provide (recorded in build.json,
# checked by the installed package before it starts a CUDA server)
function(gb_cuda_libs out major)
    file(READ "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/cuda_runtime.json" table)
    string(JSON n LENGTH "${table}" "${major}" libs)
    set(libs "")
    math(EXPR last "${n} - 1")
    foreach (i RANGE ${last})
        string(JSON l GET "${table}" "${major}" libs ${i})
        list(APPEND libs "${l}")
    endforeach()
    set(${out} "${libs}" PARENT_SCOPE)
endfunction()
