/*
 * ProcessGroupHcoll: the torch.distributed (c10d, torch 1.13) backend
 * "hcoll". Each collective is one hcoll_*_async call on the group's
 * communicator; its Work (and the Work's future, which DDP consumes) is
 * completed by hcoll's completion callback, on hcoll's worker thread: no
 * thread of ours, none per request.
 *
 *   python: dist.all_reduce(t)                       hcoll's worker thread
 *     -> ProcessGroupHcoll::allreduce
 *          hcoll_allreduce_async(comm, t, ...) ----> runs the three stages
 *          hcoll_request_set_callback(req, done)     |
 *          return WorkHcoll  (not completed)         v
 *     work.wait() / fut.wait()  <--- notify ---  done(req, status):
 *                                                  copies (allgather list)
 *                                                  Work::finish, future
 *                                                  markCompleted / setError
 *                                                  hcoll_request_free(req)
 *
 * Consequences a user sees, all from hcoll.h's rules for callbacks:
 *   - callbacks chained with future.then() run on hcoll's thread while the
 *     communicator's later requests wait: keep them short. They may issue
 *     further collectives on host tensors (issuing only queues), but must
 *     not wait for a later operation of the same group: WorkHcoll::wait
 *     refuses that with an error instead of deadlocking.
 *   - collectives run in the order they were issued, on every rank.
 * CUDA tensors (built with HCOLL_TORCH_CUDA): the call is enqueued on the
 * tensor's device's current stream, as hcoll's device calls are; the
 * future completes once the GPU has passed the collective.
 */
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "hcoll.h"

namespace hcoll_torch {

class WorkHcoll;

class ProcessGroupHcoll : public c10d::ProcessGroup {
 public:
  /* Joins the communicator whose id rank 0 made (hcoll_comm_init; blocks
   * until every member has joined). op_timeout_ms: hcoll's operation
   * timeout for this communicator (config field op_timeout_ms; 0 = none,
   * < 0 = HCOLL_OP_TIMEOUT_MS / its default); rail: config field rail (-1 =
   * HCOLL_RAIL / the default). */
  ProcessGroupHcoll(const std::string& unique_id, int rank, int size, int64_t op_timeout_ms,
                    int rail);
  ~ProcessGroupHcoll() override;

  const std::string getBackendName() const override {
    return "hcoll";
  }
  hcoll_comm_t comm() const {
    return comm_;
  }
  int64_t opTimeoutMs() const {
    return op_timeout_ms_;
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  /* Everything else: "not supported by hcoll: <op>". */
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;

 private:
  using Issue = std::function<hcoll_status_t(hcoll_request_t*)>;
  /* Issue one request and hang the Work's completion on its callback. */
  c10::intrusive_ptr<c10d::Work> launch(const c10::intrusive_ptr<WorkHcoll>& work,
                                        const char* what, const Issue& issue);
  hcoll_op_t premulOp(const c10d::ReduceOp& rop, const at::Tensor& t, hcoll_dtype_t dt,
                      WorkHcoll& work);
  c10::intrusive_ptr<c10d::Work> reduceScatterFlat(at::Tensor& output, const at::Tensor& input,
                                                   const c10d::ReduceOp& rop,
                                                   c10d::OpType type, const char* what);

  hcoll_comm_t comm_ = nullptr;
  int64_t op_timeout_ms_;
  /* hcoll wants one communicator's calls one at a time, and torch issues
   * from several threads (autograd, future callbacks). Recursive: a
   * callback that runs at once inside hcoll_request_set_callback (the
   * request had finished) may issue again. */
  std::recursive_mutex issue_mu_;
};

/* hcoll_get_unique_id as bytes (HCOLL_UNIQUE_ID_BYTES), for rank 0 to put
 * in the c10d store. */
std::string makeUniqueId();

}  // namespace hcoll_torch
