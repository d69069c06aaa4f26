#include "daemon/peer/call_cancel.h"

namespace zcc::daemon::peer {

void CallCancel::CancelAll() {
  zcc::MutexLock lock(&mu_);
  cancelled_ = true;
  // ClientContext::TryCancel is safe while another thread runs the call.
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
}

bool CallCancel::cancelled() const {
  zcc::MutexLock lock(&mu_);
  return cancelled_;
}

CallCancel::Scope::Scope(CallCancel* cancel, grpc::ClientContext* ctx)
    : cancel_(cancel), ctx_(ctx) {
  if (cancel_ == nullptr) return;
  zcc::MutexLock lock(&cancel_->mu_);
  cancel_->calls_.insert(ctx_);
  if (cancel_->cancelled_) ctx_->TryCancel();
}

CallCancel::Scope::~Scope() {
  if (cancel_ == nullptr) return;
  zcc::MutexLock lock(&cancel_->mu_);
  cancel_->calls_.erase(ctx_);
}

}  // namespace zcc::daemon::peer
