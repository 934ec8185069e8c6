#include "transport/gloo_pair_socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "gloo/transport/tcp/pair.h"

namespace hvdcompat {

namespace {

// Pair::signalExceptionExternal (what Gloo itself calls when a wait times
// out), the pair's lock, state and socket are protected; member pointers
// named through a derived class reach them.
struct PairAccess : gloo::transport::tcp::Pair {
  static constexpr auto kSignal = &PairAccess::signalExceptionExternal;

  // Calls fn(socket) under the pair's lock while it is connected (Gloo closes
  // the socket only under that lock); false when it is not.
  template <typename Fn>
  static bool WithSocket(gloo::transport::Pair* any, Fn&& fn) {
    auto* pair = dynamic_cast<gloo::transport::tcp::Pair*>(any);
    if (pair == nullptr) return false;
    std::lock_guard<std::mutex> lock(pair->*(&PairAccess::m_));
    const int fd = pair->*(&PairAccess::fd_);
    if (pair->*(&PairAccess::state_) != CONNECTED || fd < 0) return false;
    fn(fd);
    return true;
  }
};

bool ReadTcpInfo(int fd, tcp_info* info) {
  socklen_t len = sizeof(*info);
  return fd >= 0 && getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &len) == 0;
}

}  // namespace

int DuplicatePairSocket(gloo::transport::Pair* pair) {
  int dup = -1;
  PairAccess::WithSocket(pair, [&](int fd) { dup = fcntl(fd, F_DUPFD_CLOEXEC, 0); });
  return dup;
}

bool KeepPairAlive(gloo::transport::Pair* pair, int idle_s, int interval_s, int count) {
  bool ok = true;
  const int on = 1;
  PairAccess::WithSocket(pair, [&](int fd) {
    ok = setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) == 0 &&
         setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s)) == 0 &&
         setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s)) == 0 &&
         setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) == 0;
  });
  return ok;
}

int64_t SocketSilenceMs(int fd) {
  tcp_info info{};
  if (!ReadTcpInfo(fd, &info)) return -1;
  return std::min(info.tcpi_last_data_recv, info.tcpi_last_ack_recv);
}

int64_t PairSilenceMs(gloo::transport::Pair* pair) {
  int64_t ms = -1;
  PairAccess::WithSocket(pair, [&](int fd) {
    tcp_info info{};
    // A connection the peer closed is not silent: it ended (Gloo's loop may
    // not have read the end yet).
    if (ReadTcpInfo(fd, &info) && info.tcpi_state == TCP_ESTABLISHED) {
      ms = std::min(info.tcpi_last_data_recv, info.tcpi_last_ack_recv);
    }
  });
  return ms;
}

bool PeerClosedSocket(int fd) {
  tcp_info info{};
  if (!ReadTcpInfo(fd, &info)) return false;
  // The watch never closes its side while it reads: a connection that left
  // ESTABLISHED got the peer's FIN (CLOSE_WAIT) or reset (CLOSE).
  return info.tcpi_state != TCP_ESTABLISHED;
}

void FailPair(gloo::transport::Pair* pair, const std::string& why) {
  auto* tcp = pair ? dynamic_cast<gloo::transport::tcp::Pair*>(pair) : nullptr;
  if (tcp) (tcp->*PairAccess::kSignal)(why);
}

void EndConnection(int fd) {
  if (fd < 0) return;
  // Closing a socket with unread data resets the connection; the peer's
  // kernel keeps no time for a reset (Note [Who closed first]).
  char sink[65536];
  for (int i = 0; i < 256; ++i) {
    const ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && errno == EINTR)) break;
  }
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

}  // namespace hvdcompat
