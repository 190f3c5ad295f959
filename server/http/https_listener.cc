#include "server/http/https_listener.h"

#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace prefixd {

struct TlsIdentity {
  std::shared_ptr<const TlsMaterial> material;  // what it was made from
  gnutls_certificate_credentials_t credentials = nullptr;
  bool require_client_cert = false;  // material has a client CA

  TlsIdentity() = default;
  TlsIdentity(const TlsIdentity&) = delete;
  TlsIdentity& operator=(const TlsIdentity&) = delete;
  ~TlsIdentity() {
    if (credentials != nullptr)
      gnutls_certificate_free_credentials(credentials);
  }
};

namespace {

using Identity = std::shared_ptr<const TlsIdentity>;

// GnuTLS's defaults without TLS 1.0 and 1.1 (which "NORMAL" still
// offers): TLS 1.2 and 1.3 only, as the gRPC listeners.
constexpr char kPriorities[] = "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2";

absl::Status GnutlsError(absl::string_view field, int rc) {
  return absl::InvalidArgumentError(
      absl::StrCat("the Conductor API's HTTPS cannot use ", field, ": ",
                   gnutls_strerror(rc)));
}

gnutls_datum_t Datum(const std::string& text) {
  return {reinterpret_cast<unsigned char*>(const_cast<char*>(text.data())),
          static_cast<unsigned>(text.size())};
}

absl::StatusOr<Identity> MakeIdentity(std::shared_ptr<const TlsMaterial> m) {
  auto id = std::make_shared<TlsIdentity>();
  int rc = gnutls_certificate_allocate_credentials(&id->credentials);
  if (rc < 0) return GnutlsError("its credentials", rc);
  gnutls_datum_t cert = Datum(m->cert_chain);
  gnutls_datum_t key = Datum(m->private_key);
  rc = gnutls_certificate_set_x509_key_mem(id->credentials, &cert, &key,
                                           GNUTLS_X509_FMT_PEM);
  if (rc < 0) return GnutlsError("auth.tls_cert_path/tls_key_path", rc);
  if (!m->client_ca.empty()) {
    gnutls_datum_t ca = Datum(m->client_ca);
    rc = gnutls_certificate_set_x509_trust_mem(id->credentials, &ca,
                                               GNUTLS_X509_FMT_PEM);
    if (rc <= 0) {
      return GnutlsError("auth.client_ca_path",
                         rc < 0 ? rc : GNUTLS_E_NO_CERTIFICATE_FOUND);
    }
    id->require_client_cert = true;
  }
  id->material = std::move(m);
  return Identity(std::move(id));
}

gnutls_session_t SessionOf(MHD_Connection* c) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  return info == nullptr ? nullptr
                         : static_cast<gnutls_session_t>(info->tls_session);
}

// The identity the connection's handshake used (its socket context).
const TlsIdentity* IdentityOf(MHD_Connection* c) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  if (info == nullptr || info->socket_context == nullptr) return nullptr;
  return static_cast<Identity*>(info->socket_context)->get();
}

// The client certificate, when the handshake required and verified one.
std::optional<PeerCertificate> VerifiedClientCert(MHD_Connection* c) {
  const TlsIdentity* id = IdentityOf(c);
  gnutls_session_t session = SessionOf(c);
  if (id == nullptr || !id->require_client_cert || session == nullptr)
    return std::nullopt;
  unsigned n = 0;
  const gnutls_datum_t* chain = gnutls_certificate_get_peers(session, &n);
  if (chain == nullptr || n == 0) return std::nullopt;
  return PeerCertificateOfDer(absl::string_view(
      reinterpret_cast<const char*>(chain[0].data), chain[0].size));
}

// A request being read: its body up to the limit, and how much came.
struct Pending {
  HttpRequest request;
  size_t received = 0;
};

struct Resolved {
  sockaddr_storage addr{};
  bool ipv6 = false;
};

// A numeric host ("" = every IPv4 interface, as civetweb's "PORT").
absl::StatusOr<Resolved> Resolve(const ListenAddress& a) {
  std::string host = a.host;
  if (host.size() > 1 && host.front() == '[')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  addrinfo hints{};
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_family = host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string port = absl::StrCat(a.port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                             port.c_str(), &hints, &list);
  if (rc != 0 || list == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", a.host, "\" is not a numeric address: ", gai_strerror(rc)));
  }
  Resolved r;
  std::memcpy(&r.addr, list->ai_addr, list->ai_addrlen);
  r.ipv6 = list->ai_family == AF_INET6;
  freeaddrinfo(list);
  return r;
}

}  // namespace

// libmicrohttpd's callbacks; `cls` is the listener.
struct HttpsCallbacks {
  // A new connection: the identity in force, for its handshake and all its
  // requests, until it closes.
  static void OnConnection(void* cls, MHD_Connection* c, void** context,
                           MHD_ConnectionNotificationCode code) {
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
      delete static_cast<Identity*>(*context);
      *context = nullptr;
      return;
    }
    auto* id = new Identity(static_cast<HttpsListener*>(cls)->Current());
    *context = id;
    gnutls_session_t session = SessionOf(c);
    if (session == nullptr) return;  // not TLS: cannot happen (MHD_USE_TLS)
    gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, (*id)->credentials);
    if ((*id)->require_client_cert) {
      gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
      gnutls_session_set_verify_cert(session, nullptr, 0);
    }
  }

  // Called once when the headers are in, once per piece of body, then once
  // more with no data: the request is complete.
  static MHD_Result OnRequest(void* cls, MHD_Connection* c, const char* url,
                              const char* method, const char* /*version*/,
                              const char* data, size_t* size, void** pending) {
    const auto* self = static_cast<const HttpsListener*>(cls);
    const size_t max = self->limits_.max_body_bytes;
    auto* p = static_cast<Pending*>(*pending);
    if (p == nullptr) {
      p = new Pending();
      *pending = p;
      p->request.method = method;
      p->request.path = url;
      const char* a = MHD_lookup_connection_value(
          c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
      if (a != nullptr) p->request.authorization = a;
      const char* t = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                  MHD_HTTP_HEADER_CONTENT_TYPE);
      if (t != nullptr) p->request.content_type = t;
      p->request.client_cert = VerifiedClientCert(c);
      return MHD_YES;
    }
    if (*size > 0) {
      p->received += *size;
      if (p->received > 2 * max) return MHD_NO;  // cut off: closes
      if (p->received <= max) p->request.body.append(data, *size);
      *size = 0;
      return MHD_YES;
    }
    const bool ok = p->received > max
                        ? self->Answer(c, self->TooLarge(p->request))
                        : self->Answer(c, self->handler_(p->request));
    return ok ? MHD_YES : MHD_NO;
  }

  static void OnCompleted(void* /*cls*/, MHD_Connection* /*c*/, void** pending,
                          MHD_RequestTerminationCode /*code*/) {
    delete static_cast<Pending*>(*pending);
    *pending = nullptr;
  }
};

HttpsListener::HttpsListener(const HttpLimits& limits, const RotatingTls* tls,
                             HttpHandler handler)
    : limits_(limits), tls_(tls), handler_(std::move(handler)) {}

absl::StatusOr<std::unique_ptr<HttpsListener>> HttpsListener::Start(
    const ListenAddress& address, const HttpLimits& limits,
    const RotatingTls* tls, HttpHandler handler) {
  std::unique_ptr<HttpsListener> self(
      new HttpsListener(limits, tls, std::move(handler)));
  ASSIGN_OR_RETURN(Identity first, MakeIdentity(tls->material()));
  ASSIGN_OR_RETURN(Resolved where, Resolve(address));
  {
    MutexLock lock(&self->mu_);
    self->current_ = first;
  }
  const auto timeout_s = static_cast<unsigned>(std::max<int64_t>(
      1, absl::ToInt64Seconds(limits.io_timeout + absl::Milliseconds(999))));
  const unsigned flags = MHD_USE_TLS | MHD_USE_EPOLL_INTERNAL_THREAD |
                         (where.ipv6 ? MHD_USE_IPv6 : 0);
  // The daemon-wide certificate is the first identity's; each connection
  // gets the identity in force when it is accepted (OnConnection).
  self->daemon_ = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &HttpsCallbacks::OnRequest, self.get(),
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&where.addr),
      MHD_OPTION_HTTPS_MEM_KEY, first->material->private_key.c_str(),
      MHD_OPTION_HTTPS_MEM_CERT, first->material->cert_chain.c_str(),
      MHD_OPTION_HTTPS_PRIORITIES, kPriorities, MHD_OPTION_THREAD_POOL_SIZE,
      static_cast<unsigned>(limits.threads), MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned>(limits.threads + limits.queue),
      MHD_OPTION_CONNECTION_TIMEOUT, timeout_s, MHD_OPTION_LISTEN_BACKLOG_SIZE,
      static_cast<unsigned>(limits.backlog), MHD_OPTION_NOTIFY_CONNECTION,
      &HttpsCallbacks::OnConnection, self.get(), MHD_OPTION_NOTIFY_COMPLETED,
      &HttpsCallbacks::OnCompleted, self.get(), MHD_OPTION_END);
  if (self->daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on \"", address.host, ":", address.port,
                     "\" with TLS: ", std::strerror(errno)));
  }
  return self;
}

HttpsListener::~HttpsListener() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);  // joins the threads
}

int HttpsListener::port() const {
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
  return info == nullptr ? 0 : info->port;
}

std::shared_ptr<const TlsIdentity> HttpsListener::Current() {
  std::shared_ptr<const TlsMaterial> m = tls_->material();
  MutexLock lock(&mu_);
  if (m == current_->material || m == refused_) return current_;
  absl::StatusOr<Identity> fresh = MakeIdentity(m);
  if (fresh.ok()) {
    current_ = *std::move(fresh);
  } else {
    refused_ = m;
    std::fprintf(stderr, "prefixd: %s; the certificate in force stays\n",
                 std::string(fresh.status().message()).c_str());
  }
  return current_;
}

HttpResponse HttpsListener::TooLarge(const HttpRequest& request) const {
  if (limits_.body_too_large)
    return limits_.body_too_large(limits_.max_body_bytes, request);
  return HttpResponse{
      413,
      "text/plain; charset=utf-8",
      absl::StrCat("the body is over ", limits_.max_body_bytes, " bytes\n"),
      {}};
}

bool HttpsListener::Answer(MHD_Connection* c,
                           const std::optional<HttpResponse>& response) const {
  const HttpResponse r = response.value_or(
      HttpResponse{404, "text/plain; charset=utf-8", "no such page\n", {}});
  MHD_Response* out = MHD_create_response_from_buffer(
      r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
  if (out == nullptr) return false;
  MHD_add_response_header(out, MHD_HTTP_HEADER_CONTENT_TYPE,
                          r.content_type.c_str());
  MHD_add_response_header(out, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  MHD_add_response_header(out, "X-Content-Type-Options", "nosniff");
  for (const auto& [name, value] : r.headers)
    MHD_add_response_header(out, name.c_str(), value.c_str());
  const MHD_Result queued =
      MHD_queue_response(c, static_cast<unsigned>(r.status), out);
  MHD_destroy_response(out);
  return queued == MHD_YES;
}

}  // namespace prefixd
