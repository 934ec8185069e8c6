#include "transport/mpi_context.h"

#include <algorithm>
#include <cstring>

#include "core/logging.h"

namespace hvdcompat {

bool MpiContext::EnsureInitialized(int* provided) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw LibraryError(
        "MPI has already been finalized in this process (by mpi4py or another library), so "
        "hvdcompat cannot start. Initialise hvdcompat before MPI is finalized.");
  }
  if (initialized) {
    MPI_Query_thread(provided);
    return false;
  }
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, provided);
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw LibraryError("MPI_Init_thread failed: " + std::string(text, len) +
                       ". Launch with mpirun/hvdcompatrun, or check the MPI installation.");
  }
  return true;
}

MpiContext::MpiContext(MPI_Comm base, const std::vector<int>& ranks) {
  EnsureInitialized(&thread_level_);
  if (thread_level_ < MPI_THREAD_MULTIPLE) {
    HVD_LOG(kWarning) << "MPI provides thread level " << thread_level_
                      << " < MPI_THREAD_MULTIPLE; process sets and user MPI traffic from "
                         "other threads are unsafe. Initialise MPI with MPI_THREAD_MULTIPLE "
                         "(mpi4py does by default).";
  }
  MPI_Comm source = base;
  MPI_Comm subset = MPI_COMM_NULL;
  int base_size = 0;
  HVD_MPI_CHECK(base, MPI_Comm_size(base, &base_size));
  if (!ranks.empty()) {
    int base_rank = 0;
    HVD_MPI_CHECK(base, MPI_Comm_rank(base, &base_rank));
    std::vector<int> sorted(ranks);
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] < 0 || sorted[i] >= base_size || (i && sorted[i] == sorted[i - 1])) {
        throw InvalidArgument("hvd.init(comm=[...]): ranks must be distinct and in [0, " +
                              std::to_string(base_size) + "); got rank " +
                              std::to_string(sorted[i]));
      }
    }
    if (!std::binary_search(sorted.begin(), sorted.end(), base_rank)) {
      throw InvalidArgument("hvd.init(comm=[...]): this process (rank " + std::to_string(base_rank) +
                            " of the launcher's world) is not in the given rank list; only "
                            "listed processes may call hvd.init with it");
    }
  }
  // Every rank listed: the same job as no list (what the peers that passed
  // None make; Note [Agreeing on init's comm]).
  if (!ranks.empty() && static_cast<int>(ranks.size()) != base_size) {
    std::vector<int> sorted(ranks);
    std::sort(sorted.begin(), sorted.end());
    MPI_Group world_group, group;
    HVD_MPI_CHECK(base, MPI_Comm_group(base, &world_group));
    HVD_MPI_CHECK(base, MPI_Group_incl(world_group, static_cast<int>(sorted.size()),
                                       sorted.data(), &group));
    HVD_MPI_CHECK(base, MPI_Comm_create_group(base, group, 0, &subset));
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    source = subset;
  }
  HVD_MPI_CHECK(source, MPI_Comm_dup(source, &comm_));
  if (subset != MPI_COMM_NULL) MPI_Comm_free(&subset);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  HVD_MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
  HVD_MPI_CHECK(comm_, MPI_Comm_size(comm_, &size_));

  HVD_MPI_CHECK(comm_, MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL,
                                           &local_));
  HVD_MPI_CHECK(local_, MPI_Comm_rank(local_, &local_rank_));
  HVD_MPI_CHECK(local_, MPI_Comm_size(local_, &local_size_));
  HVD_MPI_CHECK(comm_, MPI_Comm_split(comm_, local_rank_, rank_, &cross_));
  HVD_MPI_CHECK(cross_, MPI_Comm_rank(cross_, &cross_rank_));
  HVD_MPI_CHECK(cross_, MPI_Comm_size(cross_, &cross_size_));
  int sizes[2] = {local_size_, -local_size_};
  HVD_MPI_CHECK(comm_, MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MIN, comm_));
  homogeneous_ = sizes[0] == -sizes[1];
  GatherHosts();
  MpiOps::Get();  // created while MPI is initialised
  topology_ = JobTopology{rank_,        size_,        local_rank_,         local_size_,
                          cross_rank_,  cross_size_,  homogeneous_,        threads_supported(),
                          hosts_};
}

void MpiContext::AllgatherFixed(const void* mine, size_t bytes, void* all) {
  HVD_ENFORCE_LT(bytes, static_cast<size_t>(INT32_MAX), "allgather record too large");
  HVD_MPI_CHECK(comm_, MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all,
                                     static_cast<int>(bytes), MPI_BYTE, comm_));
}

std::vector<std::string> MpiContext::AllgatherStrings(const std::string& mine) {
  std::vector<int> counts(size_), displs(size_);
  int len = static_cast<int>(mine.size());
  HVD_MPI_CHECK(comm_, MPI_Allgather(&len, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_));
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = total;
    total += counts[r];
  }
  std::string all(static_cast<size_t>(total), '\0');
  HVD_MPI_CHECK(comm_, MPI_Allgatherv(mine.data(), len, MPI_CHAR, &all[0], counts.data(),
                                      displs.data(), MPI_CHAR, comm_));
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], counts[r]));
  return out;
}

void MpiContext::AllreduceMin(uint64_t* words, int n) {
  HVD_MPI_CHECK(comm_, MPI_Allreduce(MPI_IN_PLACE, words, n, MPI_UINT64_T, MPI_MIN, comm_));
}

void MpiContext::GatherHosts() {
  // Fixed-size records: one Allgather, no count exchange.
  char mine[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  HVD_MPI_CHECK(comm_, MPI_Get_processor_name(mine, &len));
  std::vector<char> all(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
  HVD_MPI_CHECK(comm_, MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                                     MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm_));
  hosts_.resize(size_);
  for (int r = 0; r < size_; ++r) {
    const char* p = all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts_[r].assign(p, strnlen(p, MPI_MAX_PROCESSOR_NAME));
  }
}

MpiContext::~MpiContext() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&cross_, &local_, &comm_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

MPI_Comm MpiContext::Duplicate() const {
  MPI_Comm dup;
  HVD_MPI_CHECK(comm_, MPI_Comm_dup(comm_, &dup));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return dup;
}

}  // namespace hvdcompat
