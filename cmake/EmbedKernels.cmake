# EmbedKernels.cmake — turns kernel source files into a C file of string constants, so an
# installed library needs no kernel files at run time. Regenerated when a kernel changes.
set(CLPAR_EMBED_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/embed_run.cmake)

function(clpar_embed_kernels output symbol)
  add_custom_command(OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${output} -DSYMBOL=${symbol} "-DINPUTS=${ARGN}"
            -P ${CLPAR_EMBED_SCRIPT}
    DEPENDS ${ARGN} ${CLPAR_EMBED_SCRIPT}
    COMMENT "Embedding kernels into ${output}"
    VERBATIM)
endfunction()
