// Credentials for an object store, from where operators and users already
// keep them (the AWS conventions): the environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), else the shared credentials file
// (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials) under the profile
// AWS_PROFILE (default "default").
//
// A secret never appears in a message, a log line or a status: Describe says
// where credentials came from and names the key id's last 4 characters.
//
// Thread-safety: stateless functions.
#ifndef ZCC_STORAGE_S3_CREDENTIALS_H_
#define ZCC_STORAGE_S3_CREDENTIALS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace zcc::storage::s3 {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials only
  std::string source;         // where they came from, for messages
};

// Looks a variable up (getenv by default; tests pass their own).
using EnvLookup = std::function<const char*(const char*)>;

// NotFound when no source holds credentials; InvalidArgument when one holds
// half of them (a key id without its secret) or the file cannot be parsed.
absl::StatusOr<Credentials> LoadCredentials(const EnvLookup& env = nullptr);

// "AWS_ACCESS_KEY_ID from the environment (key id ...WXYZ)".
std::string Describe(const Credentials& credentials);

}  // namespace zcc::storage::s3

#endif  // ZCC_STORAGE_S3_CREDENTIALS_H_
