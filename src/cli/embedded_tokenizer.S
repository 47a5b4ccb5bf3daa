/* The real DeepSeek-V4 tokenizer files (models/default/), embedded so that `dsv4 make-tiny` can write a complete
   model directory from the binary alone. Paths come from CMake (DSV4_TOKENIZER_JSON / DSV4_TOKENIZER_CONFIG). */
    .section .rodata
    .global dsv4_tokenizer_json_begin
    .global dsv4_tokenizer_json_end
    .global dsv4_tokenizer_config_begin
    .global dsv4_tokenizer_config_end
    .balign 16
dsv4_tokenizer_json_begin:
    .incbin DSV4_TOKENIZER_JSON
dsv4_tokenizer_json_end:
    .balign 16
dsv4_tokenizer_config_begin:
    .incbin DSV4_TOKENIZER_CONFIG
dsv4_tokenizer_config_end:
    .section .note.GNU-stack,"",@progbits
