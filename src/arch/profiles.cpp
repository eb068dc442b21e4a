#include "arch/profiles.h"

namespace flashcute::arch {

char const* capability_name(uint32_t bit) {
  switch (bit) {
    case kMmaSync: return "mma.sync";
    case kCpAsync: return "cp.async";
    case kLdmatrix: return "ldmatrix";
    case kStmatrix: return "stmatrix";
    case kTma: return "TMA";
    case kTmaMulticast: return "TMA multicast";
    case kWgmma: return "wgmma";
    case kTcgen05: return "tcgen05";
    case kSetmaxnreg: return "setmaxnreg";
    case kMmaSyncFp8: return "mma.sync fp8";
  }
  return "?";
}

}  // namespace flashcute::arch
