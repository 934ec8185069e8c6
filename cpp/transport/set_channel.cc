#include "transport/set_channel.h"

namespace hvdcompat {

std::vector<int> NodesByCount(int size, int per_node) {
  std::vector<int> node(size);
  for (int r = 0; r < size; ++r) node[r] = r / per_node * per_node;
  return node;
}

}  // namespace hvdcompat
