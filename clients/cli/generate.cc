#include "clients/cli/generate.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_format.h"
#include "clients/cli/remote.h"
#include "linattn/v1/generation.grpc.pb.h"

namespace linattn {

absl::Status Generate(const GenerateOptions& options, std::ostream& out,
                      std::ostream& info) {
  auto channel = OpenChannel(options.server, options.connection);
  auto stub = v1::GenerationService::NewStub(channel);
  std::string session_id = options.session_id;
  const bool created = session_id.empty();
  if (created) {
    grpc::ClientContext ctx;
    v1::CreateModelSessionRequest req;
    req.set_model(options.model);
    req.set_session_id(NewSessionId());
    NameSession(ctx, req.session_id());
    v1::ModelSession session;
    if (absl::Status s =
            FromGrpcStatus(stub->CreateSession(&ctx, req, &session));
        !s.ok()) {
      return s;
    }
    session_id = session.session_id();
  }

  v1::GenerateRequest req;
  req.set_session_id(session_id);
  req.set_prompt(options.prompt);
  v1::SamplingParams* p = req.mutable_sampling();
  p->set_max_tokens(options.max_tokens);
  p->set_temperature(options.temperature);
  p->set_top_k(options.top_k);
  p->set_top_p(options.top_p);
  p->set_min_p(options.min_p);
  p->set_presence_penalty(options.presence_penalty);
  p->set_frequency_penalty(options.frequency_penalty);
  p->set_repetition_penalty(options.repeat_penalty);
  p->set_penalty_last_n(options.repeat_last_n);
  p->set_seed(options.seed);
  for (const std::string& stop : options.stop) p->add_stop(stop);

  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first;
  grpc::ClientContext ctx;
  NameSession(ctx, session_id);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse r;
  v1::GenerateResponse last;
  bool any = false;
  bool ended = false;  // the message with a finish reason arrived
  while (reader->Read(&r)) {
    if (!any) first = std::chrono::steady_clock::now();
    any = true;
    out << r.text() << std::flush;
    last = r;
    ended = !r.finish_reason().empty();
  }
  absl::Status status =
      ended ? FromGrpcStatus(reader->Finish())
            : FinishAfterFailedRead(ctx, [&] { return reader->Finish(); });
  if (status.ok() && !ended) {
    status = absl::DataLossError(
        "generate: the stream broke off before its final message (a "
        "response could not be read)");
  }
  out << "\n" << std::flush;
  const auto end = std::chrono::steady_clock::now();

  if (status.ok() && options.usage && any) {
    const double ttft = std::chrono::duration<double>(first - start).count();
    const double rest = std::chrono::duration<double>(end - first).count();
    const uint64_t n = last.usage().completion_tokens();
    info << absl::StrFormat(
        "[%d prompt tokens, %d generated (%s), first token %.1f ms, %.0f "
        "tokens/s after it]\n",
        last.usage().prompt_tokens(), n, last.finish_reason(), ttft * 1e3,
        n > 1 && rest > 0 ? (n - 1) / rest : 0.0);
  }
  if (created) {
    if (options.keep) {
      info << "session " << session_id << "\n";
    } else {
      grpc::ClientContext del_ctx;
      NameSession(del_ctx, session_id);
      v1::DeleteModelSessionRequest del;
      del.set_session_id(session_id);
      v1::DeleteModelSessionResponse ignored;
      stub->DeleteSession(&del_ctx, del, &ignored);
    }
  }
  return status;
}

}  // namespace linattn
