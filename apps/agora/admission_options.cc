#include "admission_options.h"

#include "agora/net/allowlist.h"
#include "agora/obs/log.h"

namespace agora::cli {

void add_admission_options(CLI::App& cmd, AdmissionOptions& options, const std::string& members) {
  cmd.add_option(
      "--allowlist", options.allowlist,
      "Admit only these " + members + "' keys: a file of 64-hex public keys, one per line");
  cmd.add_flag("--open", options.open,
               "Admit any key (a public run); one of --allowlist and --open is required");
}

net::Admission admission_of(const AdmissionOptions& options) {
  const net::Admission admission =
      net::admission_for(options.allowlist, options.open, {"--allowlist", "--open"});
  if (admission.open) obs::log_warn({}, "--open: any key may connect and say hello");
  return admission;
}

}  // namespace agora::cli
