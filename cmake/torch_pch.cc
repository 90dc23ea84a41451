// The translation unit that builds agora_torch_pch's precompiled <torch/torch.h>
// (cmake/AgoraTorchPch.cmake); it has nothing of its own.
