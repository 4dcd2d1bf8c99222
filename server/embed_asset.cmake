# Writes OUTPUT, a C++ source defining SYMBOL (bytes) and SYMBOL##Size from
# the file INPUT: the server's web assets are built into its binary.
file(READ "${INPUT}" hex HEX)
file(SIZE "${INPUT}" size)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}"
  "// Generated from ${INPUT} by server/embed_asset.cmake.\n"
  "#include <cstddef>\n"
  "namespace linattn {\n"
  "extern const unsigned char ${SYMBOL}[] = {${bytes} 0x00};\n"
  "extern const size_t ${SYMBOL}Size = ${size};\n"
  "}  // namespace linattn\n")
