#include "daemon/jobs/object_store_roots.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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
    if (!root.ca_bundle.empty() && n == "AWS_CA_BUNDLE") return root.ca_bundle.c_str();
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

std::string StoreJobDir(const std::string& root_url, const std::string& job_id) {
  return absl::StrCat(WithoutTrailingSlash(root_url), "/", job_id);
}

// A job's own client and storage for its directory, routed while it lives.
class ObjectStoreRoots::JobRoute {
 public:
  JobRoute(storage::RoutedStorage* routed, std::string job_dir,
           std::unique_ptr<storage::s3::S3Location> location)
      : routed_(routed), job_dir_(std::move(job_dir)), location_(std::move(location)) {
    routed_->AddRoute(job_dir_, &location_->storage(), location_->path());
  }
  ~JobRoute() { routed_->RemoveRoute(job_dir_, &location_->storage()); }

 private:
  storage::RoutedStorage* const routed_;
  const std::string job_dir_;
  const std::unique_ptr<storage::s3::S3Location> location_;
};

ObjectStoreRoots::ObjectStoreRoots(const std::vector<ObjectStoreRoot>& roots,
                                   storage::Storage* local, const storage::s3::EnvLookup& env)
    : routed_(&storage::StorageOrDefault(local)) {
  for (const ObjectStoreRoot& config : roots) {
    Root root;
    root.url = WithoutTrailingSlash(config.url);
    const storage::s3::EnvLookup lookup = RootEnvironment(config, env);
    auto endpoint = storage::s3::EndpointFromEnvironment(lookup);
    if (!endpoint.ok()) {
      root.error = endpoint.status();
      ZCC_LOG(ERROR) << "object-store root " << root.url
                     << " cannot be used; jobs naming it are refused: " << root.error;
      roots_.push_back(std::move(root));
      continue;
    }
    root.endpoint = *endpoint;
    const std::string where =
        absl::StrCat("object-store root ", root.url, " at ", root.endpoint.url, " (",
                     root.endpoint.region, ", ", root.endpoint.path_style ? "path" : "virtual",
                     "-style)");
    auto credentials = storage::s3::LoadCredentials(lookup);
    absl::StatusOr<std::unique_ptr<storage::s3::S3Location>> opened =
        credentials.ok() ? storage::s3::S3Location::Open(root.url, root.endpoint, *credentials)
                         : absl::StatusOr<std::unique_ptr<storage::s3::S3Location>>(
                               credentials.status());
    if (opened.ok()) {
      ZCC_LOG(INFO) << where << ", " << storage::s3::Describe(*credentials);
      root.location = *std::move(opened);
      routed_.AddRoute(root.url, &root.location->storage(), root.location->path());
    } else {
      root.credentials_error = opened.status();
      ZCC_LOG(WARNING) << where << ": zccd has no credentials of its own for it ("
                       << opened.status().message()
                       << "); only jobs that bring theirs can use it";
    }
    roots_.push_back(std::move(root));
  }
}

const ObjectStoreRoots::Root* ObjectStoreRoots::Find(const std::string& url) const {
  const std::string wanted = WithoutTrailingSlash(url);
  const Root* best = nullptr;
  for (const Root& root : roots_) {
    const bool under = wanted == root.url || absl::StartsWith(wanted, root.url + "/");
    if (under && (best == nullptr || root.url.size() > best->url.size())) best = &root;
  }
  return best;
}

absl::Status ObjectStoreRoots::CheckRoot(const std::string& url, bool job_credentials) const {
  // "." and ".." would be squashed on the way (HTTP clients normalize URL
  // paths) and reach keys outside the root; an empty name is no key's.
  const absl::string_view rest = absl::string_view(url).substr(std::min<size_t>(url.size(), 5));
  for (absl::string_view part : absl::StrSplit(WithoutTrailingSlash(std::string(rest)), '/')) {
    if (part.empty() || part == "." || part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint root ", url, " may not hold an empty name, '.' or '..'"));
    }
  }
  const Root* root = Find(url);
  if (root == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint root ", url, " is not under an object-store root of this zccd (",
        roots_.empty() ? std::string("none configured") : absl::StrJoin(Urls(), ", "),
        "); add it to object_store_roots or allowed_roots in zccd's configuration"));
  }
  if (!root->error.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("object-store root ", root->url,
                                                      " cannot be used: ", root->error.message()));
  }
  if (!job_credentials && root->location == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "zccd has no credentials for object-store root ", root->url, " (",
        root->credentials_error.message(), "); pass the job's own (store_credentials)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ObjectStoreRoots::JobRoute>> ObjectStoreRoots::RouteJob(
    const std::string& root_url, const std::string& job_id, storage::s3::Credentials credentials) {
  ZCC_RETURN_IF_ERROR(CheckRoot(root_url));
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError("store_credentials need an access key id and its secret");
  }
  const Root* root = Find(root_url);
  const std::string job_dir = StoreJobDir(root_url, job_id);
  zcc::MutexLock lock(&mu_);
  for (auto it = job_routes_.begin(); it != job_routes_.end();) {  // jobs gone
    it = it->second.expired() ? job_routes_.erase(it) : std::next(it);
  }
  if (auto held = job_routes_[job_dir].lock(); held != nullptr) return held;
  credentials.source = "the job's registration";
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<storage::s3::S3Location> location,
                       storage::s3::S3Location::Open(job_dir, root->endpoint,
                                                     std::move(credentials)));
  auto route = std::make_shared<JobRoute>(&routed_, job_dir, std::move(location));
  job_routes_[job_dir] = route;
  return route;
}

std::vector<std::string> ObjectStoreRoots::Urls() const {
  std::vector<std::string> urls;
  for (const Root& root : roots_) urls.push_back(root.url);
  return urls;
}

}  // namespace zcc::daemon
