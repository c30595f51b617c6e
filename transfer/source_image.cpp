#include "transfer/source_image.h"

#include <algorithm>

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
  img->device_ = std::shared_ptr<CudaBuffer>(std::move(buf));
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

Result<std::shared_ptr<SourceImage>> SourceImage::copy_of(MemoryType type, std::vector<uint8_t> bytes) {
  if (type == MemoryType::Host) return adopt(std::move(bytes));
  K3_ASSIGN_OR_RETURN(auto img, create(type, bytes.size()));
#ifdef K3_TRANSFER_HAVE_CUDA
  if (!bytes.empty()) K3_TRY(static_cast<CudaBuffer*>(img->device_.get())->upload(bytes.data(), bytes.size()));
#endif
  return img;
}

}  // namespace k3::transfer
