#include "transfer/source_image.h"

#include <algorithm>
#include <cstring>
#include <string>

#ifdef K3_TRANSFER_HAVE_CUDA
#include "transfer/cuda/cuda_memory.h"
#endif

namespace k3::transfer {

Result<std::shared_ptr<SourceImage>> SourceImage::create(MemoryType type, size_t bytes) {
  std::shared_ptr<SourceImage> img(new SourceImage());
  img->type_ = type;
  img->size_ = bytes;
  if (type == MemoryType::Host) {
    img->host_.resize(bytes);
    img->data_ = img->host_.data();
    return img;
  }
#ifdef K3_TRANSFER_HAVE_CUDA
  // At least one byte, so that data() is never null for a held image (null means "none held").
  K3_ASSIGN_OR_RETURN(std::unique_ptr<CudaBuffer> buf, CudaBuffer::create(std::max<size_t>(bytes, 1)));
  img->data_ = static_cast<uint8_t*>(buf->data());
  img->owner_ = std::shared_ptr<CudaBuffer>(std::move(buf));
  return img;
#else
  return unsupported("source images in device memory need a CUDA build (-DK3_CUDA=ON)");
#endif
}

std::shared_ptr<SourceImage> SourceImage::adopt(std::vector<uint8_t> bytes) {
  std::shared_ptr<SourceImage> img(new SourceImage());
  img->host_ = std::move(bytes);
  img->data_ = img->host_.data();
  img->size_ = img->host_.size();
  return img;
}

std::shared_ptr<SourceImage> SourceImage::view(MemoryType type, uint8_t* data, size_t size, std::shared_ptr<void> owner,
                                               const UcxMemory* registration) {
  std::shared_ptr<SourceImage> img(new SourceImage());
  img->type_ = type;
  img->data_ = data;
  img->size_ = size;
  img->owner_ = std::move(owner);
  img->registration_ = registration;
  return img;
}

Status SourceImage::gather_to(const GatheredWrites& g, SourceImage& staging) const {
  if (staging.type_ != type_ || staging.size_ < g.staged_bytes)
    return invalid_argument("source gather: a staging image of " + std::to_string(staging.size_) + " bytes (" +
                            memory_type_name(staging.type_) + ") for " + std::to_string(g.staged_bytes) + " bytes (" +
                            memory_type_name(type_) + ")");
  for (const RowGather& r : g.gathers)
    if (r.rows > 0 && (r.src_offset > size_ || (r.rows - 1) * r.pitch + r.row_bytes > size_ - r.src_offset))
      return Status(Code::OutOfRange, "source gather: rows at " + std::to_string(r.src_offset) + " run past the image");
  if (type_ == MemoryType::Host) {
    gather_on_host(g, data_, staging.data_);
    return Status::ok();
  }
#ifdef K3_TRANSFER_HAVE_CUDA
  for (const RowGather& r : g.gathers)
    K3_TRY(cuda_gather_rows(staging.data_ + r.staged_offset, data_ + r.src_offset, r.row_bytes, r.pitch, r.rows));
  return cuda_copies_done();
#else
  return unsupported("source images in device memory need a CUDA build (-DK3_CUDA=ON)");
#endif
}

Status SourceImage::upload(const std::vector<uint8_t>& bytes) {
  if (bytes.size() > size_)
    return invalid_argument("source image upload: " + std::to_string(bytes.size()) + " bytes into an image of " +
                            std::to_string(size_));
  if (bytes.empty()) return Status::ok();
  if (type_ == MemoryType::Host) {
    std::memcpy(data_, bytes.data(), bytes.size());
    return Status::ok();
  }
#ifdef K3_TRANSFER_HAVE_CUDA
  return cuda_upload(data_, bytes.data(), bytes.size());
#else
  return unsupported("source images in device memory need a CUDA build (-DK3_CUDA=ON)");
#endif
}

}  // namespace k3::transfer
