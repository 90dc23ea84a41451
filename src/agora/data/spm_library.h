// SpmLibrary: the loaded SentencePiece bridge module (spm_bridge/spm_bridge.h), found once per
// process and shared. Its location, first match wins: $AGORA_SPM_LIBRARY; the build tree's
// module (a path fixed at compile time); libagora_spm.so beside the running executable.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "agora/data/spm_bridge/spm_bridge.h"

namespace agora::spm {

struct Library {
  decltype(&agora_spm_load) load;
  decltype(&agora_spm_release) release;
  decltype(&agora_spm_piece_size) piece_size;
  decltype(&agora_spm_eos_id) eos_id;
  decltype(&agora_spm_encode) encode;
  decltype(&agora_spm_decode) decode;
  decltype(&agora_spm_train) train;
};

// The bridge, loaded on first use. Throws Error saying where it looked when it cannot be loaded.
const Library& library();

}  // namespace agora::spm
