#include "transfer/ucx_context.h"

#ifdef K3_TRANSFER_HAVE_CUDA
#include "transfer/cuda/cuda_memory.h"
#endif

#include <poll.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

namespace k3::transfer {

const char* memory_type_name(MemoryType t) {
  switch (t) {
    case MemoryType::Host: return "host";
    case MemoryType::Cuda: return "cuda";
  }
  return "?";
}

Status prepare_memory_type(MemoryType type, int cuda_device, const std::string& what) {
  if (type == MemoryType::Host) return Status::ok();
#ifdef K3_TRANSFER_HAVE_CUDA
  return cuda_make_current(cuda_device);
#else
  (void)cuda_device;
  return unsupported(what + ": a CUDA build (-DK3_CUDA=ON) is required");
#endif
}

Status ucx_status(ucs_status_t s, const std::string& what) {
  if (s == UCS_OK) return Status::ok();
  Code code = Code::Internal;
  switch (s) {
    case UCS_ERR_TIMED_OUT: code = Code::DeadlineExceeded; break;
    case UCS_ERR_CANCELED: code = Code::Aborted; break;
    case UCS_ERR_NO_MEMORY: case UCS_ERR_NO_RESOURCE: code = Code::ResourceExhausted; break;
    case UCS_ERR_UNREACHABLE: case UCS_ERR_CONNECTION_RESET: case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED: case UCS_ERR_REJECTED: code = Code::Unavailable; break;
    case UCS_ERR_INVALID_PARAM: code = Code::InvalidArgument; break;
    case UCS_ERR_UNSUPPORTED: code = Code::Unsupported; break;
    default: break;
  }
  return {code, what + ": " + ucs_status_string(s)};
}

// ---------------------------------------------------------------------------------------------
Result<std::shared_ptr<UcxContext>> UcxContext::create(uint64_t features, const std::string& net_devices) {
  ucp_config_t* config = nullptr;
  K3_TRY(ucx_status(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read"));
  if (!net_devices.empty()) {
    const ucs_status_t mst = ucp_config_modify(config, "NET_DEVICES", net_devices.c_str());
    if (mst != UCS_OK) {
      ucp_config_release(config);
      return ucx_status(mst, "UCX NET_DEVICES=" + net_devices);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = features | UCP_FEATURE_WAKEUP;
  ucp_context_h ctx = nullptr;
  ucs_status_t st = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  K3_TRY(ucx_status(st, "ucp_init"));
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(ctx, &attr) != UCS_OK) attr.memory_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
  return std::shared_ptr<UcxContext>(new UcxContext(ctx, attr.memory_types));
}

UcxContext::~UcxContext() { ucp_cleanup(ctx_); }

bool UcxContext::supports(MemoryType t) const {
  switch (t) {
    case MemoryType::Host: return true;
    case MemoryType::Cuda: return (memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
Result<std::shared_ptr<UcxWorker>> UcxWorker::create(std::shared_ptr<UcxContext> ctx, bool serialized) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = serialized ? UCS_THREAD_MODE_SERIALIZED : UCS_THREAD_MODE_SINGLE;
  ucp_worker_h w = nullptr;
  K3_TRY(ucx_status(ucp_worker_create(ctx->get(), &params, &w), "ucp_worker_create"));
  int efd = -1;
  ucs_status_t st = ucp_worker_get_efd(w, &efd);
  if (st != UCS_OK) {
    ucp_worker_destroy(w);
    return ucx_status(st, "ucp_worker_get_efd");
  }
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(w, &addr, &len);
  if (st != UCS_OK) {
    ucp_worker_destroy(w);
    return ucx_status(st, "ucp_worker_get_address");
  }
  std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(addr), reinterpret_cast<uint8_t*>(addr) + len);
  ucp_worker_release_address(w, addr);
  return std::shared_ptr<UcxWorker>(new UcxWorker(std::move(ctx), w, efd, std::move(bytes)));
}

UcxWorker::~UcxWorker() { ucp_worker_destroy(worker_); }

unsigned UcxWorker::progress() {
  unsigned total = 0;
  while (unsigned n = ucp_worker_progress(worker_)) total += n;
  return total;
}

Result<bool> UcxWorker::arm() {
  ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_OK) return true;
  if (st == UCS_ERR_BUSY) return false;
  return ucx_status(st, "ucp_worker_arm");
}

Status UcxWorker::wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout,
                             std::chrono::microseconds busy_poll, const std::function<Status()>& idle) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  for (;;) {
    progress();
    if (done()) return Status::ok();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return {Code::DeadlineExceeded, "UCX wait timed out"};
    if (now - start < busy_poll) continue;
    if (idle) K3_TRY(idle());
    K3_ASSIGN_OR_RETURN(bool armed, arm());
    if (!armed) continue;  // events arrived between progress() and arm(): progress again
    // Cap each sleep: some transports (tcp connection setup) progress on timers, not fds.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    pollfd pfd{efd_, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::min<long>(left + 1, 50)));
    if (rc < 0 && errno != EINTR) return io_error(std::string("poll on UCX event fd: ") + std::strerror(errno));
  }
}

Result<std::shared_ptr<UcxEndpoint>> UcxWorker::connect(std::span<const uint8_t> peer_address,
                                                       bool peer_error_handling) {
  if (peer_address.empty()) return invalid_argument("UcxWorker::connect: empty peer worker address");
  std::shared_ptr<UcxEndpoint> ep(new UcxEndpoint(shared_from_this()));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  params.err_mode = peer_error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &UcxEndpoint::on_error;
  params.err_handler.arg = ep.get();
  K3_TRY(ucx_status(ucp_ep_create(worker_, &params, &ep->ep_), "ucp_ep_create"));
  return ep;
}

// ---------------------------------------------------------------------------------------------
void UcxEndpoint::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* self = static_cast<UcxEndpoint*>(arg);
  self->failed_ = true;
  self->failure_ = status;
  spdlog::debug("UCX endpoint failed: {}", ucs_status_string(status));
}

Status UcxEndpoint::flush(std::chrono::milliseconds timeout) {
  if (failed_) return ucx_status(failure_, "endpoint flush (peer failed)");
  auto* c = new UcxCompletion;
  ucp_request_param_t p = ucx_send_param(c);
  return ucx_wait(*worker_, ucp_ep_flush_nbx(ep_, &p), c, timeout, "ucp_ep_flush_nbx");
}

std::unique_ptr<UcxEndpoint::PendingFlush> UcxEndpoint::flush_async() {
  std::unique_ptr<PendingFlush> f(new PendingFlush());
  f->worker_ = worker_;
  if (failed_) {
    f->posted_ = ucx_status(failure_, "endpoint flush (peer failed)");
    return f;
  }
  auto* c = new UcxCompletion;
  ucp_request_param_t p = ucx_send_param(c);
  ucs_status_ptr_t req = ucp_ep_flush_nbx(ep_, &p);
  if (UCS_PTR_IS_ERR(req)) {
    delete c;
    f->posted_ = ucx_status(UCS_PTR_STATUS(req), "ucp_ep_flush_nbx");
  } else if (req == nullptr) {
    delete c;   // completed in place; the callback is not called
  } else {
    f->req_ = req;
    f->c_ = c;
  }
  return f;
}

bool UcxEndpoint::PendingFlush::done() const { return c_ == nullptr || c_->done; }

Status UcxEndpoint::PendingFlush::status() const {
  if (!posted_.is_ok()) return posted_;
  if (c_ == nullptr) return Status::ok();
  if (!c_->done) return {Code::DeadlineExceeded, "ucp_ep_flush_nbx: not complete"};
  return ucx_status(c_->status, "ucp_ep_flush_nbx");
}

UcxEndpoint::PendingFlush::~PendingFlush() {
  if (c_ == nullptr) return;
  if (c_->done) {
    delete c_;
    return;
  }
  c_->abandoned = true;   // the callback frees it when UCX completes (or cancels) the request
  ucp_request_cancel(worker_->get(), req_);
}

UcxEndpoint::~UcxEndpoint() {
  if (!ep_) return;
  // Graceful close flushes outstanding operations; a failed peer can only be closed by force.
  auto* c = new UcxCompletion;
  ucp_request_param_t p = ucx_send_param(c);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = failed_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep_, &p);
  Status s = ucx_wait(*worker_, req, c, std::chrono::milliseconds(2000), "ucp_ep_close_nbx");
  if (!s.is_ok()) spdlog::debug("endpoint close: {}", s.to_string());
}

// ---------------------------------------------------------------------------------------------
namespace {
void on_send_complete(void* request, ucs_status_t status, void* user_data) {
  auto* c = static_cast<UcxCompletion*>(user_data);
  ucp_request_free(request);
  if (c->abandoned) { delete c; return; }
  c->done = true;
  c->status = status;
}
void on_recv_complete(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* c = static_cast<UcxCompletion*>(user_data);
  ucp_request_free(request);
  if (c->abandoned) { delete c; return; }
  c->done = true;
  c->status = status;
  if (status == UCS_OK && info) c->received_length = info->length;
}
}  // namespace

ucp_request_param_t ucx_send_param(UcxCompletion* c) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &on_send_complete;
  p.user_data = c;
  return p;
}

ucp_request_param_t ucx_recv_param(UcxCompletion* c) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv = &on_recv_complete;
  p.user_data = c;
  return p;
}

Status ucx_wait(UcxWorker& worker, ucs_status_ptr_t req, UcxCompletion* c, std::chrono::milliseconds timeout,
                const std::string& what, size_t* received, const std::function<Status()>& idle) {
  if (UCS_PTR_IS_ERR(req)) {
    delete c;
    return ucx_status(UCS_PTR_STATUS(req), what);
  }
  if (req == nullptr) {  // completed in place; the callback is not called
    delete c;
    return Status::ok();
  }
  Status waited = worker.wait_until([c] { return c->done; }, timeout, std::chrono::microseconds{0}, idle);
  if (!waited.is_ok()) {
    c->abandoned = true;  // the callback frees it when UCX finally completes the request
    ucp_request_cancel(worker.get(), req);
    return {waited.code(), what + ": " + waited.message()};
  }
  ucs_status_t st = c->status;
  if (received) *received = c->received_length;
  delete c;
  return ucx_status(st, what);
}

}  // namespace k3::transfer
