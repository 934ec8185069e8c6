/*
 * The slice of the DLPack C ABI (stable since v0.6) that hvdcompat's core
 * needs to hand buffers it allocated to a framework without linking it:
 * device and dtype descriptors, the tensor view and the managed-tensor
 * wrapper exchanged through a PyCapsule named "dltensor".
 * Declared here from the published specification; layout must match it.
 */
#ifndef HVDCOMPAT_THIRD_PARTY_DLPACK_H_
#define HVDCOMPAT_THIRD_PARTY_DLPACK_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides; /* NULL: compact row-major */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

#ifdef __cplusplus
}
#endif

#endif /* HVDCOMPAT_THIRD_PARTY_DLPACK_H_ */
