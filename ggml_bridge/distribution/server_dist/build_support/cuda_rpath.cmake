# _gb_cuda_runtime_list(<out> <major> <key>): the list <key> of CUDA <major> in cuda_runtime.json (beside this file).
# A major the table does not name is a fatal error.
function(_gb_cuda_runtime_list out major key)
    file(READ "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/cuda_runtime.json" table)
    string(JSON n ERROR_VARIABLE err LENGTH "${table}" "${major}" ${key})
    if (err)
        message(FATAL_ERROR "ggml-bridge-server: build_support/cuda_runtime.json names no runtime wheels for CUDA "
                            "${major}; use a CUDA 12 or 13 toolkit")
    endif()
    set(items "")
    math(EXPR last "${n} - 1")
    foreach (i RANGE ${last})
        string(JSON item GET "${table}" "${major}" ${key} ${i})
        list(APPEND items "${item}")
    endforeach()
    set(${out} "${items}" PARENT_SCOPE)
endfunction()

# gb_cuda_rpath(<out> <major>): ";$ORIGIN/../../<dir>" for each folder where NVIDIA's runtime wheels of CUDA <major>
# put their libraries, as seen from ggml_bridge_server/{bin,lib}: two levels up is site-packages.
function(gb_cuda_rpath out major)
    _gb_cuda_runtime_list(dirs ${major} libdirs)
    list(TRANSFORM dirs PREPEND "$ORIGIN/../../")
    set(${out} ";${dirs}" PARENT_SCOPE)
endfunction()

# gb_cuda_libs(<out> <major>): the sonames NVIDIA's runtime wheels of CUDA <major> provide (recorded in build.json,
# checked by the installed package before it starts a CUDA server)
function(gb_cuda_libs out major)
    _gb_cuda_runtime_list(libs ${major} libs)
    set(${out} "${libs}" PARENT_SCOPE)
endfunction()
