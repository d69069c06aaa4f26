#include "daemon/jobs/object_store_roots.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {
namespace {

std::string WithoutTrailingSlash(std::string url) {
  while (url.size() > 5 && url.back() == '/') url.pop_back();
  return url;
}

// zccd's environment with the root's own settings over it: each setting is
// the AWS variable a tool would take it from.
storage::s3::EnvLookup RootEnvironment(const ObjectStoreRoot& root,
                                       const storage::s3::EnvLookup& env) {
  const storage::s3::EnvLookup base =
      env ? env : [](const char* name) -> const char* { return std::getenv(name); };
  return [root, base](const char* name) -> const char* {
    const std::string n = name;
    if (!root.endpoint_url.empty() && (n == "AWS_ENDPOINT_URL_S3" || n == "AWS_ENDPOINT_URL")) {
      return root.endpoint_url.c_str();
    }
    if (!root.region.empty() && (n == "AWS_REGION" || n == "AWS_DEFAULT_REGION")) {
      return root.region.c_str();
    }
    if (!root.addressing.empty() && n == "ZCC_S3_ADDRESSING") return root.addressing.c_str();
    if (!root.profile.empty()) {
      // The root's profile, not keys meant for something else.
      if (n == "AWS_PROFILE") return root.profile.c_str();
      if (n == "AWS_ACCESS_KEY_ID" || n == "AWS_SECRET_ACCESS_KEY" || n == "AWS_SESSION_TOKEN") {
        return nullptr;
      }
    }
    return base(name);
  };
}

}  // namespace

bool IsObjectStoreUrl(const std::string& root) { return absl::StartsWith(root, "s3://"); }

ObjectStoreRoots::ObjectStoreRoots(const std::vector<ObjectStoreRoot>& roots,
                                   storage::Storage* local, const storage::s3::EnvLookup& env)
    : routed_(&storage::StorageOrDefault(local)) {
  for (const ObjectStoreRoot& config : roots) {
    Root root;
    root.url = WithoutTrailingSlash(config.url);
    const storage::s3::EnvLookup lookup = RootEnvironment(config, env);
    absl::StatusOr<std::unique_ptr<storage::s3::S3Location>> opened = [&]()
        -> absl::StatusOr<std::unique_ptr<storage::s3::S3Location>> {
      ZCC_ASSIGN_OR_RETURN(storage::s3::Endpoint endpoint,
                           storage::s3::EndpointFromEnvironment(lookup));
      ZCC_ASSIGN_OR_RETURN(storage::s3::Credentials credentials,
                           storage::s3::LoadCredentials(lookup));
      ZCC_LOG(INFO) << "object-store root " << root.url << " at " << endpoint.url << " ("
                    << endpoint.region << ", " << (endpoint.path_style ? "path" : "virtual")
                    << "-style), " << storage::s3::Describe(credentials);
      return storage::s3::S3Location::Open(root.url, std::move(endpoint), std::move(credentials));
    }();
    if (opened.ok()) {
      root.location = *std::move(opened);
      routed_.AddRoute(root.url, &root.location->storage(), root.location->path());
    } else {
      root.error = opened.status();
      ZCC_LOG(ERROR) << "object-store root " << root.url
                     << " cannot be used; jobs naming it are refused: " << root.error;
    }
    roots_.push_back(std::move(root));
  }
}

absl::Status ObjectStoreRoots::CheckRoot(const std::string& url) const {
  const std::string wanted = WithoutTrailingSlash(url);
  const Root* best = nullptr;
  for (const Root& root : roots_) {
    const bool under = wanted == root.url || absl::StartsWith(wanted, root.url + "/");
    if (under && (best == nullptr || root.url.size() > best->url.size())) best = &root;
  }
  if (best == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint root ", url, " is not under an object-store root of this zccd (",
        roots_.empty() ? std::string("none configured") : absl::StrJoin(Urls(), ", "),
        "); add it to object_store_roots or allowed_roots in zccd's configuration"));
  }
  if (!best->error.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("object-store root ", best->url,
                                                      " cannot be used: ", best->error.message()));
  }
  return absl::OkStatus();
}

std::vector<std::string> ObjectStoreRoots::Urls() const {
  std::vector<std::string> urls;
  for (const Root& root : roots_) urls.push_back(root.url);
  return urls;
}

}  // namespace zcc::daemon
