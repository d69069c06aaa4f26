#include "daemon/peer/peer_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zcc::daemon::peer {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("peer: no ", what, " file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("peer: cannot read the ", what, " file ", path));
  }
  std::ostringstream out;
  out << in.rdbuf();
  std::string pem = out.str();
  if (pem.size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer: the ", what, " file ", path, " is larger than 1 MiB"));
  }
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer: the ", what, " file ", path, " holds no PEM block"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<PeerCredentials> LoadPeerCredentials(const PeerConfig& config) {
  PeerCredentials creds;
  if (config.insecure) {
    creds.server = grpc::InsecureServerCredentials();
    creds.channel = grpc::InsecureChannelCredentials();
    return creds;
  }
  auto cert = ReadPem(config.cert_file, "certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(config.key_file, "private key");
  if (!key.ok()) return key.status();
  auto ca = ReadPem(config.ca_file, "CA");
  if (!ca.ok()) return ca.status();

  grpc::SslServerCredentialsOptions server(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  server.pem_root_certs = *ca;
  server.pem_key_cert_pairs.push_back({*key, *cert});
  creds.server = grpc::SslServerCredentials(server);

  grpc::SslCredentialsOptions channel;
  channel.pem_root_certs = *ca;
  channel.pem_private_key = *key;
  channel.pem_cert_chain = *cert;
  creds.channel = grpc::SslCredentials(channel);
  creds.tls = true;
  return creds;
}

}  // namespace zcc::daemon::peer
