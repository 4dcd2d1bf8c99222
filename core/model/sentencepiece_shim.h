// The C interface of liblinattn_sentencepiece.so, a small module around
// Debian's libsentencepiece that tokenizer.cc loads at run time.
//
// Why a module: libsentencepiece.so carries its own copy of protobuf-lite
// and exports it. Linked into a process that also has libprotobuf (every
// gRPC program), the two copies interpose on each other and the process
// crashes while it registers its descriptors. Loaded with dlopen(RTLD_LOCAL
// | RTLD_DEEPBIND), the module and libsentencepiece bind to their own
// protobuf and the rest of the process never sees it. Only this interface
// crosses: C types, no exceptions, no Abseil (sentencepiece_processor.h
// defines its own absl::string_view, which collides with Abseil's).
#ifndef LINATTN_CORE_MODEL_SENTENCEPIECE_SHIM_H_
#define LINATTN_CORE_MODEL_SENTENCEPIECE_SHIM_H_

#include <stddef.h>

extern "C" {

// A loaded model, or null with the reason in `error` (NUL-terminated).
void* linattn_spm_load(const char* path, char* error, size_t error_size);
void linattn_spm_free(void* processor);
int linattn_spm_size(void* processor);
// Encodes text[0..length) into ids[0..capacity). Returns the number of ids
// (which may exceed capacity: call again with more room), or -1 with the
// reason in `error`.
long linattn_spm_encode(void* processor, const char* text, size_t length,
                        int* ids, size_t capacity, char* error,
                        size_t error_size);
// The bytes piece `id` stands for inside a text ("▁" is a space, byte
// pieces their byte, control pieces nothing), into out[0..capacity).
// Returns the length (which may exceed capacity).
size_t linattn_spm_piece(void* processor, int id, char* out, size_t capacity);
// The text of ids[0..count) as a whole, as SentencePiece decodes it (the
// space its encoder puts before a text is not part of it), into
// out[0..capacity). Returns the length (which may exceed capacity), or -1
// with the reason in `error`.
long linattn_spm_decode(void* processor, const int* ids, size_t count,
                        char* out, size_t capacity, char* error,
                        size_t error_size);

}  // extern "C"

#endif  // LINATTN_CORE_MODEL_SENTENCEPIECE_SHIM_H_
