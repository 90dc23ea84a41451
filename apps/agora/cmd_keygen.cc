// agora keygen: make an identity (an ed25519 key pair) for a peer or a coordinator.
#include <fmt/format.h>

#include "agora/net/identity.h"
#include "commands.h"

namespace agora::cli {

void add_keygen_command(CLI::App& app) {
  struct Args {
    std::string out;
    bool force = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("keygen", "Make an ed25519 identity for a peer or coordinator");
  cmd->add_option("--out", args->out, "Key file to write (mode 0600)")->required();
  cmd->add_flag("--force", args->force, "Replace an existing key file");
  cmd->callback([args] {
    const net::Identity id = net::Identity::generate();
    id.save(args->out, args->force);
    // The public key alone on stdout, so scripts can capture it; the explanation on stderr.
    fmt::print(stderr,
               "wrote {}; its public key (give it to the coordinator's allowlist, or to "
               "peers as --coordinator-key):\n",
               args->out);
    fmt::print("{}\n", net::key_to_hex(id.public_key()));
  });
}

}  // namespace agora::cli
