// Hugging Face's tokenizer (@huggingface/tokenizers, npm) as the reference
// linattn's tokenizer.json tests compare against.
//
//   node tokenizer_oracle.mjs REQUEST.json
//
// REQUEST: {"tokenizer": path, "texts": [string], "decode": [[id]]}
// Prints: {"encode": [[id]]            each text without special tokens,
//          "encode_start": [[id]]      each text with them,
//          "decode": [string]}         each id list decoded, special tokens
//                                      skipped, no clean-up of spaces
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const request = JSON.parse(readFileSync(process.argv[2], "utf8"));
const tok = new Tokenizer(
  JSON.parse(readFileSync(request.tokenizer, "utf8")), {});
const out = { encode: [], encode_start: [], decode: [] };
for (const text of request.texts) {
  out.encode.push(tok.encode(text, { add_special_tokens: false }).ids);
  out.encode_start.push(tok.encode(text, { add_special_tokens: true }).ids);
}
for (const ids of request.decode) {
  // decode([]) throws in this package; the empty text is its answer.
  out.decode.push(ids.length === 0 ? "" : tok.decode(ids, {
    skip_special_tokens: true, clean_up_tokenization_spaces: false }));
}
process.stdout.write(JSON.stringify(out));
