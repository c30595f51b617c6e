#include "transfer/ucx_writer.h"

#include <cstring>
#include <string>

namespace k3::transfer {

Status HostSourceReader::copy_to_host(void* host_dst, const void* src, size_t n) const {
  std::memcpy(host_dst, src, n);
  return Status::ok();
}

// Outstanding puts of one write() call. Heap-allocated and shared with the put callbacks: if
// write() gives up (timeout) while puts are posted, the last callback frees it.
struct UcxWriter::Batch {
  struct Token {
    Batch* batch;
    int slot;  // staging slot the put reads from, or -1 for a direct put
  };
  explicit Batch(int slots) : slot_busy(slots, false) {
    tokens.push_back({this, -1});
    for (int i = 0; i < slots; ++i) tokens.push_back({this, i});
  }
  size_t pending = 0;
  ucs_status_t first_error = UCS_OK;
  bool abandoned = false;
  std::vector<bool> slot_busy;
  std::vector<Token> tokens;  // never resized after construction: callbacks hold pointers into it

  Token* token(int slot) { return &tokens[slot + 1]; }
  static void on_put_done(void* request, ucs_status_t status, void* user_data) {
    auto* t = static_cast<Token*>(user_data);
    Batch* b = t->batch;
    ucp_request_free(request);
    if (status != UCS_OK && b->first_error == UCS_OK) b->first_error = status;
    if (t->slot >= 0) b->slot_busy[t->slot] = false;
    if (--b->pending == 0 && b->abandoned) delete b;
  }
};

Result<std::unique_ptr<UcxWriter>> UcxWriter::create(std::shared_ptr<UcxWorker> worker,
                                                     std::shared_ptr<const SourceReader> reader,
                                                     WriterOptions options) {
  if (!worker) return invalid_argument("UcxWriter::create: worker is null");
  if (!reader) return invalid_argument("UcxWriter::create: reader is null");
  if (options.staging_slots < 1) return invalid_argument("WriterOptions.staging_slots must be >= 1");
  if (options.staging_slot_bytes == 0) return invalid_argument("WriterOptions.staging_slot_bytes must be > 0");
  if (options.max_outstanding_puts == 0) return invalid_argument("WriterOptions.max_outstanding_puts must be > 0");
  std::unique_ptr<UcxWriter> w(new UcxWriter(worker, reader, options));
  const bool direct = !options.force_staging && worker->context()->supports(reader->type());
  if (!direct) {
    // Pinned staging: one registered host range, split into slots.
    w->staging_buf_.resize(options.staging_slot_bytes * options.staging_slots);
    K3_ASSIGN_OR_RETURN(w->staging_, UcxMemory::map(worker->context(), w->staging_buf_.data(), w->staging_buf_.size()));
  }
  return w;
}

UcxWriter::~UcxWriter() = default;

Status UcxWriter::post_put(const RemoteKey& dest, const void* src, size_t n, uint64_t remote, Batch& batch, int slot,
                           const UcxMemory* source) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &Batch::on_put_done;
  p.user_data = batch.token(slot);
  if (opt_.batch_hint) p.op_attr_mask |= UCP_OP_ATTR_FLAG_MULTI_SEND;
  if (slot >= 0) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memh = staging_->get();
    p.memory_type = UCS_MEMORY_TYPE_HOST;
  } else if (source != nullptr) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;  // memory type and device come with the registration
    p.memh = source->get();
  } else if (reader_->type() == MemoryType::Cuda) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  ucs_status_ptr_t req = ucp_put_nbx(dest.endpoint()->get(), src, n, remote, dest.get(), &p);
  if (UCS_PTR_IS_ERR(req)) return ucx_status(UCS_PTR_STATUS(req), "ucp_put_nbx");
  stats_.puts++;
  stats_.bytes += n;
  if (req != nullptr) {
    batch.pending++;
    if (slot >= 0) batch.slot_busy[slot] = true;
  }
  return Status::ok();
}

namespace {
std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return d.count() > 0 ? d : std::chrono::milliseconds(0);
}
}  // namespace

Status UcxWriter::write_direct(const RemoteKey& dest, std::span<const RemoteWrite> writes, Batch& batch,
                               const std::function<bool()>& should_stop,
                               std::chrono::steady_clock::time_point deadline, const UcxMemory* source) {
  for (const RemoteWrite& w : writes) {
    if (should_stop && should_stop()) return {Code::Aborted, "write cancelled"};
    if (batch.pending >= opt_.max_outstanding_puts) {
      K3_TRY(worker_->wait_until([&] { return batch.pending < opt_.max_outstanding_puts; }, left_until(deadline)));
    }
    if (batch.first_error != UCS_OK) return ucx_status(batch.first_error, "ucp_put_nbx completion");
    K3_TRY(post_put(dest, w.src, w.length, w.remote_addr, batch, -1, source));
  }
  return Status::ok();
}

Status UcxWriter::write_staged(const RemoteKey& dest, std::span<const RemoteWrite> writes, Batch& batch,
                               const std::function<bool()>& should_stop,
                               std::chrono::steady_clock::time_point deadline) {
  int next_slot = 0;
  for (const RemoteWrite& w : writes) {
    for (size_t off = 0; off < w.length; off += opt_.staging_slot_bytes) {
      if (should_stop && should_stop()) return {Code::Aborted, "write cancelled"};
      const size_t n = std::min(opt_.staging_slot_bytes, w.length - off);
      const int slot = next_slot;
      next_slot = (next_slot + 1) % opt_.staging_slots;
      // Reuse a slot only once its previous put has completed locally (the bytes left the buffer).
      if (batch.slot_busy[slot]) {
        K3_TRY(worker_->wait_until([&] { return !batch.slot_busy[slot]; }, left_until(deadline)));
      }
      if (batch.first_error != UCS_OK) return ucx_status(batch.first_error, "ucp_put_nbx completion");
      uint8_t* bounce = staging_buf_.data() + static_cast<size_t>(slot) * opt_.staging_slot_bytes;
      K3_TRY(reader_->copy_to_host(bounce, static_cast<const uint8_t*>(w.src) + off, n));
      K3_TRY(post_put(dest, bounce, n, w.remote_addr + off, batch, slot));
    }
  }
  return Status::ok();
}

Status UcxWriter::write(const RemoteKey& dest, std::span<const RemoteWrite> writes,
                        const std::function<bool()>& should_stop, const UcxMemory* source) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<InFlight> list, post(dest, writes, should_stop, source));
  return wait(*list);
}

Result<std::unique_ptr<UcxWriter::InFlight>> UcxWriter::post(const RemoteKey& dest, std::span<const RemoteWrite> writes,
                                                             const std::function<bool()>& should_stop,
                                                             const UcxMemory* source) {
  for (size_t i = 0; i < writes.size(); ++i) {
    const RemoteWrite& w = writes[i];
    if (w.length == 0) return invalid_argument("writes[" + std::to_string(i) + "].length is 0");
    if (w.src == nullptr) return invalid_argument("writes[" + std::to_string(i) + "].src is null");
    if (!dest.contains(w.remote_addr, w.length))
      return Status{Code::OutOfRange, "writes[" + std::to_string(i) + "] [" + std::to_string(w.remote_addr) + ", +" +
                                          std::to_string(w.length) + ") is outside the destination registration"};
    if (source && !source->contains(w.src, w.length))
      return Status{Code::OutOfRange, "writes[" + std::to_string(i) + "] source is outside the given source registration"};
  }
  if (source && source->type() != reader_->type())
    return invalid_argument(std::string("UcxWriter::write: source registration is ") + memory_type_name(source->type()) +
                            " memory but the writer's reader reads " + memory_type_name(reader_->type()) + " memory");
  if (dest.endpoint()->worker() != worker_) return invalid_argument("UcxWriter::write: rkey belongs to another worker");
  std::unique_ptr<InFlight> list(new InFlight());
  list->deadline_ = std::chrono::steady_clock::now() + opt_.timeout;
  list->batch_ = new Batch(staging_ ? opt_.staging_slots : 0);
  list->result_ = staging_ ? write_staged(dest, writes, *list->batch_, should_stop, list->deadline_)
                           : write_direct(dest, writes, *list->batch_, should_stop, list->deadline_, source);
  // Complete at the remote side (also drains the posted puts after a cancel or an error).
  list->flush_ = dest.endpoint()->flush_async();
  // The bounce buffers are the writer's: a staged list completes here, nothing of it stays in flight.
  if (staging_) (void)wait(*list);
  return list;
}

Status UcxWriter::wait(InFlight& list) {
  if (!list.batch_) return list.result_;   // waited already (a staged list: in post())
  Batch* batch = list.batch_;
  Status waited = worker_->wait_until([&] { return list.done(); }, left_until(list.deadline_), opt_.busy_poll);
  Status result = list.result_;
  if (result.is_ok() && batch->first_error != UCS_OK) result = ucx_status(batch->first_error, "ucp_put_nbx completion");
  if (result.is_ok()) result = list.flush_->status();
  if (result.is_ok()) result = waited;
  list.batch_ = nullptr;
  release(batch);
  list.flush_.reset();
  list.result_ = result;
  return result;
}

void UcxWriter::release(Batch* batch) {
  if (batch->pending == 0) {
    delete batch;
  } else {
    batch->abandoned = true;  // freed by the last callback
  }
}

bool UcxWriter::InFlight::done() const {
  return !batch_ || (batch_->pending == 0 && (!flush_ || flush_->done()));
}

UcxWriter::InFlight::~InFlight() {
  flush_.reset();   // an unfinished flush is cancelled and its record left to UCX
  if (batch_) UcxWriter::release(batch_);
}

}  // namespace k3::transfer
