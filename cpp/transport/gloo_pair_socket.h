// The kernel's side of Gloo's TCP pairs, for the watch (Note [Lost peers on
// Gloo], Note [Who closed first], transport/gloo_watch.h): keepalives, how
// long ago a connection last received anything, whether the peer closed it,
// and a second descriptor of the watch's own on each connection.
//
// Gloo (vendored unmodified) keeps a pair's socket, lock and state protected;
// these functions reach them under the pair's lock, the lock Gloo closes the
// socket under. Thread: any.
#pragma once

#include <cstdint>
#include <string>

namespace gloo {
namespace transport {
class Pair;
}  // namespace transport
}  // namespace gloo

namespace hvdcompat {

// A duplicate (close-on-exec) of `pair`'s socket while it is connected, else
// -1. The connection then lives until both Gloo's descriptor and this one
// are closed.
int DuplicatePairSocket(gloo::transport::Pair* pair);

// Turns on TCP keepalives on `pair`'s socket: the first probe after `idle_s`
// of quiet, then one every `interval_s`, `count` in all. False (errno set)
// when a setting was refused; true when the pair is not connected.
bool KeepPairAlive(gloo::transport::Pair* pair, int idle_s, int interval_s, int count);

// Milliseconds since the connection of `pair` last received anything, data
// or acknowledgement, from the kernel; -1 when the pair is not connected or
// its peer closed the connection.
int64_t PairSilenceMs(gloo::transport::Pair* pair);

// The same for a socket descriptor (-1 when the kernel does not say).
int64_t SocketSilenceMs(int fd);

// Whether the peer of the connection `fd` closed it or reset it (the kernel
// has its FIN or RST), whatever this side's state.
bool PeerClosedSocket(int fd);

// Fails `pair` with `why`, as Gloo does when a wait on it times out: its
// pending and later calls throw, and Gloo closes its descriptor. Keeps the
// first exception where the pair already failed.
void FailPair(gloo::transport::Pair* pair, const std::string& why);

// Closes the connection `fd` (the watch's own descriptor, Gloo's closed):
// unread data is dropped first, so the peer gets a FIN, whose arrival time
// its kernel keeps, rather than a reset.
void EndConnection(int fd);

}  // namespace hvdcompat
