#include "rpc_core.h"

#include <iterator>
#include <map>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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
  std::shared_ptr<grpc::ChannelCredentials> creds = ChannelCredentialsOrFail(options, &args);
  std::shared_ptr<grpc::Channel> channel;
  if (options.dedicated_connection) {
    channel = grpc::CreateCustomChannel(options.address, creds, args);
  } else {
    // One channel per (address, server name, TLS credentials) in the process, while any Client
    // holds it. Plaintext channels would share their connection anyway (gRPC's subchannel pool),
    // TLS ones would not (gRPC compares TLS credentials by object): each Client would make its
    // own connection and handshake. Sharing the channel makes both one HTTP/2 connection.
    // Credentials of equal PEM bytes are one object (credentials.cc); plaintext ones all match.
    struct Shared {
      std::weak_ptr<grpc::Channel> channel;
      std::shared_ptr<grpc::ChannelCredentials> creds;  // keeps the key's object alive
    };
    using Key = std::tuple<std::string, std::string, const void*>;
    static absl::Mutex mu(absl::kConstInit);
    static auto* cache = new std::map<Key, Shared>();
    const bool tls = !options.tls_ca_file.empty();
    absl::MutexLock lock(&mu);
    for (auto it = cache->begin(); it != cache->end();) {  // forget channels nobody holds
      it = it->second.channel.expired() ? cache->erase(it) : std::next(it);
    }
    Shared& slot = (*cache)[{options.address, options.tls_server_name, tls ? creds.get() : nullptr}];
    channel = slot.channel.lock();
    if (channel == nullptr) {
      channel = grpc::CreateCustomChannel(options.address, creds, args);
      slot = {channel, creds};
    }
  }
  return std::shared_ptr<RpcCore>(
      new RpcCore(std::move(channel), options.address, options.rpc_timeout_ms,
                  options.shared_namespace));
}

}  // namespace oscarkv::client
