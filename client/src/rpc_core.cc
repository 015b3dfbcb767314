#include "rpc_core.h"

#include "absl/strings/str_cat.h"
#include "credentials.h"

namespace oscarkv::client {

std::shared_ptr<RpcCore> RpcCore::Dial(const ConnectOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // no transparent retries: less work per call
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Own subchannel: one that other channels share may still be backing off from an earlier
  // incarnation of the daemon at this address.
  if (options.dedicated_connection) args.SetInt("grpc.use_local_subchannel_pool", 1);
  auto channel =
      grpc::CreateCustomChannel(options.address, ChannelCredentialsOrFail(options, &args), args);
  return std::shared_ptr<RpcCore>(
      new RpcCore(std::move(channel), options.address, options.rpc_timeout_ms,
                  options.shared_namespace));
}

}  // namespace oscarkv::client
