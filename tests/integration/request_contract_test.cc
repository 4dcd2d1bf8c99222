// What a request that is wrong gets back, through a real server: the field
// named (at any depth), the right code, and a message that stays small
// whatever the client sent.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <gtest/gtest.h>

#include <string>

#include "linattn/v1/attention.grpc.pb.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "tests/integration/server_process.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class RequestContractTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ =
        testing::ServerProcess::Start({"--model", LINATTN_BUILTIN_MODEL_DIR})
            .release();
  }
  static void TearDownTestSuite() { delete server_; }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  // `message` serialised, then every occurrence of the marker "@@" in the
  // bytes replaced by 0xFF 0xFE (not UTF-8), sent as `method`.
  static grpc::Status SendWithBadUtf8(
      const std::string& method, const google::protobuf::Message& message) {
    std::string bytes = message.SerializeAsString();
    for (size_t at = bytes.find("@@"); at != std::string::npos;
         at = bytes.find("@@", at)) {
      bytes.replace(at, 2, "\xFF\xFE");
    }
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    auto channel = server_->Channel();
    return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer,
                                             grpc::ByteBuffer>(
        channel.get(),
        grpc::internal::RpcMethod(method.c_str(),
                                  grpc::internal::RpcMethod::NORMAL_RPC),
        &ctx, request, &response);
  }

  static testing::ServerProcess* server_;
};
testing::ServerProcess* RequestContractTest::server_ = nullptr;

TEST_F(RequestContractTest, StringsThatAreNotUtf8AreNamedAtAnyDepth) {
  {
    v1::GetSessionRequest req;
    req.set_session_id("ab@@");
    const grpc::Status s =
        SendWithBadUtf8("/linattn.v1.AttentionService/GetSession", req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("session_id: not valid UTF-8"));
  }
  {
    v1::CreateSessionRequest req;
    req.mutable_spec()->set_num_heads(1);
    req.mutable_spec()->set_feature_map("elu@@");
    const grpc::Status s =
        SendWithBadUtf8("/linattn.v1.AttentionService/CreateSession", req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("spec.feature_map"));
  }
  {
    v1::AppendRequest req;
    req.set_session_id("x");
    req.set_text("In the @@ beginning");
    const grpc::Status s =
        SendWithBadUtf8("/linattn.v1.GenerationService/Append", req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("text: not valid UTF-8"));
  }
  {
    // Bytes that are not a message of the method's type at all.
    grpc::Slice slice(std::string("\xFF\xFF\xFF\xFF\xFF", 5));
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    auto channel = server_->Channel();
    const grpc::Status s =
        grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            channel.get(),
            grpc::internal::RpcMethod("/linattn.v1.AttentionService/GetSession",
                                      grpc::internal::RpcMethod::NORMAL_RPC),
            &ctx, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("not a valid"));
  }
}

TEST_F(RequestContractTest, UnknownIdsAreQuotedOnlyWhenTheyCouldBeIds) {
  auto stub = v1::AttentionService::NewStub(server_->Channel());
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id("no-such-session");
    v1::Session resp;
    const grpc::Status s = stub->GetSession(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("'no-such-session'"));
  }
  // An 8 KB id cannot be anyone's: refused without echoing it, so the
  // status stays far below clients' metadata limits.
  for (auto* service : {"attention", "generation"}) {
    const std::string huge(8192, 'x');
    grpc::ClientContext ctx;
    grpc::Status s;
    if (std::string(service) == "attention") {
      v1::DeleteSessionRequest req;
      req.set_session_id(huge);
      v1::DeleteSessionResponse resp;
      s = stub->DeleteSession(&ctx, req, &resp);
    } else {
      auto gen = v1::GenerationService::NewStub(server_->Channel());
      v1::GetModelSessionRequest req;
      req.set_session_id(huge);
      v1::ModelSession resp;
      s = gen->GetSession(&ctx, req, &resp);
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << service;
    EXPECT_THAT(s.error_message(), HasSubstr("session_id: not a session id"));
    EXPECT_LT(s.error_message().size(), 200u) << service;
  }
}

TEST_F(RequestContractTest, ErrorsNameTheFieldTheClientSet) {
  auto attention = v1::AttentionService::NewStub(server_->Channel());
  auto generation = v1::GenerationService::NewStub(server_->Channel());
  {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest create;
    create.mutable_spec()->set_num_heads(1);
    create.mutable_spec()->set_key_dim(2);
    create.mutable_spec()->set_value_dim(2);
    v1::Session session;
    ASSERT_TRUE(attention->CreateSession(&ctx, create, &session).ok());
    grpc::ClientContext fork_ctx;
    v1::ForkRequest fork;
    fork.set_session_id(session.session_id());
    fork.set_new_session_id("bad id!");
    v1::Session child;
    const grpc::Status s = attention->Fork(&fork_ctx, fork, &child);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("new_session_id"));
  }
  grpc::ClientContext ctx;
  v1::ModelSession session;
  ASSERT_TRUE(generation->CreateSession(&ctx, {}, &session).ok());
  {
    grpc::ClientContext fork_ctx;
    v1::ForkModelSessionRequest fork;
    fork.set_session_id(session.session_id());
    fork.set_new_session_id(session.session_id());  // taken
    v1::ModelSession child;
    const grpc::Status s = generation->Fork(&fork_ctx, fork, &child);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_THAT(s.error_message(), HasSubstr("new_session_id"));
  }
  {
    grpc::ClientContext gen_ctx;
    v1::GenerateRequest req;
    req.set_session_id(session.session_id());
    req.add_prompt_token_ids(65);
    req.add_prompt_token_ids(99999);
    auto reader = generation->Generate(&gen_ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("prompt_token_ids[1]"));
    EXPECT_THAT(s.error_message(), Not(HasSubstr(" token_ids[1]")));
  }
}

}  // namespace
}  // namespace linattn
