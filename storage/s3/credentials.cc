#include "storage/s3/credentials.h"

#include <cstdlib>
#include <exception>

#include <boost/property_tree/ini_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace zcc::storage::s3 {
namespace {

std::string Get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v == nullptr ? std::string() : std::string(v);
}

absl::StatusOr<Credentials> FromFile(const std::string& path, const std::string& profile) {
  if (!PathExists(path)) return absl::NotFoundError(absl::StrCat("no ", path));
  boost::property_tree::ptree tree;
  try {
    boost::property_tree::ini_parser::read_ini(path, tree);
  } catch (const std::exception& e) {
    // (The parser's message names a line, never its content.)
    return absl::InvalidArgumentError(absl::StrCat("cannot parse ", path, ": ", e.what()));
  }
  auto section = tree.get_child_optional(profile);
  if (!section) {
    return absl::NotFoundError(absl::StrCat(path, " has no profile [", profile, "]"));
  }
  Credentials c;
  c.access_key_id = section->get<std::string>("aws_access_key_id", "");
  c.secret_access_key = section->get<std::string>("aws_secret_access_key", "");
  c.session_token = section->get<std::string>("aws_session_token", "");
  c.source = absl::StrCat(path, " [", profile, "]");
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.source, " needs both aws_access_key_id and aws_secret_access_key"));
  }
  return c;
}

}  // namespace

absl::StatusOr<Credentials> LoadCredentials(const EnvLookup& lookup) {
  const EnvLookup env = lookup ? lookup : [](const char* name) { return std::getenv(name); };
  Credentials c;
  c.access_key_id = Get(env, "AWS_ACCESS_KEY_ID");
  c.secret_access_key = Get(env, "AWS_SECRET_ACCESS_KEY");
  c.session_token = Get(env, "AWS_SESSION_TOKEN");
  if (!c.access_key_id.empty() || !c.secret_access_key.empty()) {
    if (c.access_key_id.empty() || c.secret_access_key.empty()) {
      return absl::InvalidArgumentError(
          "the environment sets only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
    }
    c.source = "the environment";
    return c;
  }
  std::string path = Get(env, "AWS_SHARED_CREDENTIALS_FILE");
  if (path.empty()) {
    const std::string home = Get(env, "HOME");
    if (home.empty()) return absl::NotFoundError("no credentials: no AWS_* variables and no HOME");
    path = JoinPath(home, ".aws/credentials");
  }
  std::string profile = Get(env, "AWS_PROFILE");
  if (profile.empty()) profile = "default";
  auto from_file = FromFile(path, profile);
  if (absl::IsNotFound(from_file.status())) {
    return absl::NotFoundError(absl::StrCat(
        "no credentials: AWS_ACCESS_KEY_ID is not set and ", from_file.status().message()));
  }
  return from_file;
}

std::string Describe(const Credentials& c) {
  const std::string& id = c.access_key_id;
  return absl::StrCat("credentials from ", c.source.empty() ? "the caller" : c.source,
                      " (key id ...", id.size() > 4 ? id.substr(id.size() - 4) : id, ")");
}

}  // namespace zcc::storage::s3
