# cmake/EmbedFile.cmake — turn a file into a C source with a byte array.
# Usage: cmake -DIN=<file> -DOUT=<file.c> -DNAME=<symbol> -P EmbedFile.cmake
# Produces: const unsigned char NAME[]; const unsigned long NAME_len;
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" hexlen)
math(EXPR len "${hexlen} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}" "/* Generated from ${IN} by cmake/EmbedFile.cmake; do not edit. */\n"
  "const unsigned char ${NAME}[] = {\n${bytes}0x00};\n"
  "const unsigned long ${NAME}_len = ${len};\n")
