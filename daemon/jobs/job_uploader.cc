#include "daemon/jobs/job_uploader.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_upload.h"
#include "format/manifest.h"
#include "common/log.h"
#include "common/thread_priority.h"

namespace zcc::daemon {

JobUploader::JobUploader(UploaderOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

JobUploader::~JobUploader() {
  {
    zcc::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void JobUploader::OnCommitted(int64_t step, absl::Time write_began) {
  zcc::MutexLock lock(&mu_);
  // The latest commit is what the store should hold: a newer step, or an
  // older one committed again (a run resumed from it) supersedes the one
  // waiting.
  if (wanted_ < 0) waiting_since_ = absl::Now();
  wanted_ = step;
  wanted_write_began_ = write_began;
  retry_at_ = absl::InfinitePast();  // try at once
}

bool JobUploader::Busy() const {
  zcc::MutexLock lock(&mu_);
  return wanted_ >= 0 && error_.empty();
}

void JobUploader::CatchUp() {
  auto here = checkpoint::ReadLatest(options_.job_dir, options_.storage);
  if (!here.ok()) return;
  auto there = checkpoint::ReadLatest(options_.upload_dir, options_.storage);
  if (there.ok() && *there >= *here) return;
  zcc::MutexLock lock(&mu_);
  if (wanted_ >= 0) return;  // a commit came first
  ZCC_LOG(INFO) << "job " << options_.job_id << ": " << format::StepDirName(*here)
                << " is not in " << options_.upload_dir << " yet; uploading it";
  wanted_ = *here;
  wanted_write_began_ = absl::InfiniteFuture();
  waiting_since_ = absl::Now();
}

bool JobUploader::Uploading(int64_t step) const {
  zcc::MutexLock lock(&mu_);
  return uploading_ == step;
}

double JobUploader::LagSeconds() const {
  zcc::MutexLock lock(&mu_);
  if (wanted_ < 0) return 0;
  return absl::ToDoubleSeconds(absl::Now() - waiting_since_);
}

void JobUploader::FillStatus(v1::JobStatus* out) const {
  const double lag = LagSeconds();
  zcc::MutexLock lock(&mu_);
  out->set_upload_dir(options_.upload_dir);
  out->set_last_uploaded_step(uploaded_);
  out->set_upload_pending_step(wanted_);
  out->set_upload_lag_seconds(lag);
  out->set_upload_error(error_);
}

void JobUploader::Loop() {
  // The local step is read as the job's owner.
  ScopedFsIdentity as_owner(options_.owner);
  // Reading the local step and handing it to the store's requests runs on
  // cores nothing else wants.
  MakeThisThreadIdle();
  CatchUp();
  zcc::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (wanted_ >= 0 && absl::Now() >= retry_at_);
    };
    const absl::Time wake = retry_at_;
    if (wake > absl::Now() && wake != absl::InfiniteFuture()) {
      mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
    } else {
      mu_.Await(absl::Condition(&ready));
    }
    if (stop_) return;
    if (!ready()) continue;
    const int64_t step = wanted_;
    const absl::Time write_began = wanted_write_began_;
    uploading_ = step;
    mu_.Unlock();
    Upload(step, write_began);
    mu_.Lock();
    uploading_ = -1;
  }
}

void JobUploader::Upload(int64_t step, absl::Time write_began) {
  const std::function<bool()> cancelled = [this] {
    zcc::MutexLock lock(&mu_);
    return stop_;
  };
  checkpoint::UploadOptions options;
  options.write_began = write_began;
  options.cancelled = &cancelled;
  auto uploaded = checkpoint::UploadStep(*options_.storage, options_.job_dir, step,
                                         options_.upload_dir, options);
  if (uploaded.ok()) {
    ZCC_LOG(INFO) << "upload job=" << options_.job_id << " step=" << step
                  << " bytes=" << uploaded->bytes << " seconds=" << uploaded->seconds
                  << " to " << options_.upload_dir;
    if (options_.metrics != nullptr) options_.metrics->upload_bytes().Increment(uploaded->bytes);
    {
      // In the store from now on (retention there comes after).
      zcc::MutexLock lock(&mu_);
      uploaded_ = step;
      error_.clear();
      if (wanted_ == step) {
        wanted_ = -1;
        waiting_since_ = absl::InfiniteFuture();
      }
    }
    auto retained = checkpoint::ApplyRetention(options_.upload_dir, options_.retention,
                                               checkpoint::RetentionGuard(),
                                               options_.commit_timeout, options_.storage);
    if (!retained.ok()) {
      ZCC_LOG(WARNING) << "job " << options_.job_id << ": retention in " << options_.upload_dir
                       << " failed: " << retained.status();
    }
    return;
  }
  if (!absl::IsCancelled(uploaded.status())) {
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": upload of step " << step << " to "
                     << options_.upload_dir << " failed: " << uploaded.status();
    if (options_.metrics != nullptr) {
      options_.metrics->errors(metrics::ErrorKind::kUpload).Increment();
    }
  }
  zcc::MutexLock lock(&mu_);
  if (absl::IsFailedPrecondition(uploaded.status()) && wanted_ == step) {
    // The local step is gone (retention removed it first): nothing to send;
    // a newer one comes with the next commit.
    wanted_ = -1;
    waiting_since_ = absl::InfiniteFuture();
  }
  error_ = absl::StrCat("upload of step ", step, " failed: ", uploaded.status().message());
  if (wanted_ == step) retry_at_ = absl::Now() + options_.retry_after;
}

}  // namespace zcc::daemon
