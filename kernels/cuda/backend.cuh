#pragma once
// CoreBackend whole: the class (kernels/cuda/backend_core.h) and every op family's definitions, each beside its
// kernels. A Device's translation unit includes this one to make a CoreBackend<Device>: the emulated device
// (kernels/cuda/emu/emulated_backend.cc) and the CUDA runtime (kernels/cuda/device/cuda_backend.cu).

#include "kernels/cuda/attention_backend.cuh"
#include "kernels/cuda/backend_core.h"
#include "kernels/cuda/elementwise_backend.cuh"
#include "kernels/cuda/linear_backend.cuh"
#include "kernels/cuda/lora_backend.cuh"
#include "kernels/cuda/pages_backend.cuh"
#include "kernels/cuda/sampling_backend.cuh"
