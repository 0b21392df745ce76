// ocl_clblast_params.cc — the one call of CLBlast's that its C API lacks: reading the
// parameters CLBlast would use for a kernel on a device (clblast::RetrieveParameters), which
// the GEMM tuner (ocl_tune.c) needs to start from, to restore, and to know the exact set of
// names CLBlastOverrideParameters expects. A C function, so the rest of the backend stays C.
#include <clblast.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ocl_tune.h"

extern "C" int clpar_ocl_clblast_params(cl_device_id device, const char *kernel,
                                        clpar_ocl_params *out) {
  out->n = 0;
  try {
    std::unordered_map<std::string, size_t> params;
    if (clblast::RetrieveParameters(device, kernel, clblast::Precision::kSingle, params) !=
        clblast::StatusCode::kSuccess)
      return -1;
    std::vector<std::pair<std::string, size_t>> sorted(params.begin(), params.end());
    std::sort(sorted.begin(), sorted.end());
    if (sorted.size() > CLPAR_OCL_MAX_PARAMS) return -1;
    for (const auto &p : sorted) {
      if (p.first.size() >= sizeof out->name[0]) return -1;
      std::snprintf(out->name[out->n], sizeof out->name[0], "%s", p.first.c_str());
      out->value[out->n++] = p.second;
    }
    return 0;
  } catch (...) {
    out->n = 0;
    return -1;
  }
}
