/* The c10d backend "hcoll": see process_group_hcoll.hpp for the shape. */
#include "process_group_hcoll.hpp"

#include <Python.h>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <utility>

#ifdef HCOLL_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace hcoll_torch {

namespace {

/* The communicator whose completion callback this thread is running (on
 * hcoll's worker, or on the issuing thread when the request had already
 * finished), so that a wait that cannot finish is refused, not hung. */
thread_local hcoll_comm_t tl_callback_comm = nullptr;

[[noreturn]] void unsupported(const std::string& op) {
  TORCH_CHECK(false, "not supported by hcoll: ", op);
}

/* "HCOLL_ERR_TIMEOUT: <the communicator's message>" (hcoll's messages
 * usually start with the status name already). */
std::string status_message(hcoll_status_t st, hcoll_comm_t comm) {
  const std::string name = hcoll_status_name(st);
  const char* msg = hcoll_comm_last_error(comm);
  if (!msg || !*msg)
    return name + ": " + hcoll_strerror(st);
  if (std::string(msg).compare(0, name.size(), name) == 0)
    return msg;
  return name + ": " + msg;
}

void check_status(hcoll_status_t st, hcoll_comm_t comm, const char* what) {
  if (st != HCOLL_SUCCESS)
    TORCH_CHECK(false, "hcoll ", what, " failed: ", status_message(st, comm));
}

bool dtype_of(at::ScalarType t, hcoll_dtype_t* out) {
  switch (t) {
    case at::kFloat: *out = HCOLL_FLOAT32; return true;
    case at::kHalf: *out = HCOLL_FLOAT16; return true;
    case at::kBFloat16: *out = HCOLL_BFLOAT16; return true;
    case at::kDouble: *out = HCOLL_FLOAT64; return true;
    case at::kChar: *out = HCOLL_INT8; return true;
    case at::kByte: *out = HCOLL_UINT8; return true;
    case at::kInt: *out = HCOLL_INT32; return true;
    case at::kLong: *out = HCOLL_INT64; return true;
    default: return false;
  }
}

/* The dtype a reduction runs in; hcoll reduces these eight only. */
hcoll_dtype_t reduce_dtype(const at::Tensor& t, const char* op) {
  hcoll_dtype_t d;
  TORCH_CHECK(dtype_of(t.scalar_type(), &d), "hcoll ", op, ": dtype ", t.scalar_type(),
              " is not supported (float32, float16, bfloat16, float64, int8, uint8, int32, "
              "int64)");
  return d;
}

void check_tensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "hcoll ", op, ": undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "hcoll ", op, ": only dense tensors are supported");
  TORCH_CHECK(t.is_contiguous(), "hcoll ", op, ": the tensor must be contiguous");
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), "hcoll ", op, ": tensors must be on CPU or CUDA, not ",
              t.device());
#ifndef HCOLL_TORCH_CUDA
  TORCH_CHECK(!t.is_cuda(), "hcoll ", op,
              ": this hcoll extension was built without CUDA (torch had no CUDA when it was "
              "built)");
#endif
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "hcoll ", op, ": dtypes differ (",
              a.scalar_type(), " and ", b.scalar_type(), ")");
  TORCH_CHECK(a.device() == b.device(), "hcoll ", op, ": devices differ (", a.device(), " and ",
              b.device(), ")");
}

/* The one tensor per process that every supported call takes. */
at::Tensor& single(std::vector<at::Tensor>& ts, const char* op) {
  if (ts.size() != 1)
    unsupported(std::string(op) + " of " + std::to_string(ts.size()) +
                " tensors per process (one tensor per process only)");
  check_tensor(ts[0], op);
  return ts[0];
}

/* The stream a call on t is ordered on: NULL (host) for CPU tensors, the
 * current stream of t's device for CUDA tensors, as ProcessGroupNCCL's
 * callers expect (torch's default stream, handle 0, is passed as
 * CU_STREAM_LEGACY, 0x1, which hcoll reads as a stream and not as "host"). */
void* stream_of(const at::Tensor& t) {
#ifdef HCOLL_TORCH_CUDA
  if (t.is_cuda()) {
    void* s = c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
    return s ? s : reinterpret_cast<void*>(0x1);
  }
#endif
  (void)t;
  return nullptr;
}

size_t nbytes(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

}  // namespace

/* ------------------------------------------------------------------------ */

class WorkHcoll : public c10d::Work {
 public:
  WorkHcoll(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
            hcoll_comm_t comm)
      : c10d::Work(rank, type, title),
        outputs_(std::move(outputs)),
        comm_(comm),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()), devices_of(outputs_))) {}

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }
  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (tl_callback_comm == comm_ && !isCompleted())
      TORCH_CHECK(false,
                  "hcoll: a completion callback (future.then) waited for an unfinished "
                  "operation of its own process group; it runs on hcoll's thread and would "
                  "deadlock. Issue the operation there, wait for it elsewhere.");
    return c10d::Work::wait(timeout);
  }

  /* Buffers the operation reads or writes besides the outputs (flattened
   * copies, a PREMUL_SUM scalar): alive until it completes. */
  std::vector<at::Tensor> keep;
  /* CPU: run on success before completion (allgather's copy into a list). */
  std::function<void()> on_success;
  /* The stream the call was ordered on (CUDA), for the future's events. */
  void* stream = nullptr;

  /* From the completion callback: the Work, then its future. */
  void complete(hcoll_status_t st, const std::string& what) {
    std::exception_ptr err;
    if (st != HCOLL_SUCCESS) {
      err = std::make_exception_ptr(
          std::runtime_error("hcoll " + what + " failed: " + status_message(st, comm_)));
    } else if (on_success) {
      try {
        on_success();
      } catch (...) {
        err = std::current_exception();
      }
    }
    keep.clear();
    on_success = nullptr;
    finish(err);
    complete_future(err);
  }

 private:
  static std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& ts) {
    std::vector<c10::Device> d;
    for (const auto& t : ts)
      if (t.is_cuda() && std::find(d.begin(), d.end(), t.device()) == d.end())
        d.push_back(t.device());
    return d;
  }

  void complete_future(std::exception_ptr err) {
#ifdef HCOLL_TORCH_CUDA
    /* A CUDA future records its events on the current stream: make that
     * the stream the collective ran on, not this thread's default. */
    c10::optional<c10::cuda::CUDAStreamGuard> guard;
    if (stream && !outputs_.empty() && outputs_[0].is_cuda() &&
        stream != reinterpret_cast<void*>(0x1))
      guard.emplace(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream),
                                                     outputs_[0].device().index()));
#endif
    if (err)
      future_->setError(err);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

  std::vector<at::Tensor> outputs_;
  hcoll_comm_t comm_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

namespace {

struct Pending {
  c10::intrusive_ptr<WorkHcoll> work;
  hcoll_comm_t comm;
  std::string what;
};

/* hcoll's completion callback: on hcoll's worker thread, exactly once. It
 * frees its own request (allowed there) and must not throw. */
void on_complete(hcoll_request_t req, hcoll_status_t st, void* arg) {
  Pending* p = static_cast<Pending*>(arg);
  hcoll_comm_t prev = tl_callback_comm;
  tl_callback_comm = p->comm;
  try {
    p->work->complete(st, p->what);
  } catch (...) {
    /* complete() catches what it calls; nothing may leave a C callback. */
  }
  tl_callback_comm = prev;
  hcoll_request_free(req);
  delete p;
}

}  // namespace

/* ------------------------------------------------------------------------ */

std::string makeUniqueId() {
  hcoll_unique_id_t id;
  hcoll_status_t st = hcoll_get_unique_id(&id);
  check_status(st, nullptr, "get_unique_id");
  return std::string(reinterpret_cast<const char*>(id.internal), sizeof id.internal);
}

ProcessGroupHcoll::ProcessGroupHcoll(const std::string& unique_id, int rank, int size,
                                     int64_t op_timeout_ms, int rail)
    : c10d::ProcessGroup(rank, size), op_timeout_ms_(op_timeout_ms) {
  TORCH_CHECK(unique_id.size() == HCOLL_UNIQUE_ID_BYTES, "hcoll: the unique id has ",
              unique_id.size(), " bytes, not ", HCOLL_UNIQUE_ID_BYTES);
  hcoll_unique_id_t id;
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
  if (op_timeout_ms >= 0)
    cfg.op_timeout_ms = static_cast<int>(std::min<int64_t>(op_timeout_ms, 86400000));
  cfg.rail = rail;
  hcoll_status_t st = hcoll_comm_init(&comm_, size, rank, &id, &cfg);
  check_status(st, nullptr, "comm_init");
}

ProcessGroupHcoll::~ProcessGroupHcoll() {
  /* Waits for outstanding operations; their callbacks complete the Works.
   * From one of this group's own callbacks hcoll refuses (it would wait
   * for itself): the communicator is then left to the process's exit. */
  if (!comm_)
    return;
  /* Python drops the last reference with the GIL held, and a pending
   * operation's future callbacks may need it to finish. */
  PyThreadState* saved = nullptr;
  if (Py_IsInitialized() && PyGILState_Check())
    saved = PyEval_SaveThread();
  hcoll_comm_destroy(comm_);
  if (saved)
    PyEval_RestoreThread(saved);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::launch(const c10::intrusive_ptr<WorkHcoll>& work,
                                                         const char* what, const Issue& issue) {
  hcoll_comm_t comm = comm_;
  std::lock_guard<std::recursive_mutex> lock(issue_mu_);
  hcoll_request_t req = nullptr;
  check_status(issue(&req), comm, what);
  auto* p = new Pending{work, comm, what};
  hcoll_status_t st = hcoll_request_set_callback(req, on_complete, p);
  if (st != HCOLL_SUCCESS) {
    delete p;
    hcoll_request_free(req);
    check_status(st, comm, what);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  at::Tensor& t = single(tensors, "allreduce");
  const hcoll_dtype_t dt = reduce_dtype(t, "allreduce");
  auto work = c10::make_intrusive<WorkHcoll>(rank_, c10d::OpType::ALLREDUCE, "hcoll:all_reduce",
                                             tensors, comm_);
  work->stream = stream_of(t);
  hcoll_op_t op;
  bool premul = false;
  switch (opts.reduceOp.op_) {
    case c10d::ReduceOp::SUM: op = HCOLL_SUM; break;
    case c10d::ReduceOp::AVG: op = HCOLL_AVG; break;
    case c10d::ReduceOp::PRODUCT: op = HCOLL_PROD; break;
    case c10d::ReduceOp::MIN: op = HCOLL_MIN; break;
    case c10d::ReduceOp::MAX: op = HCOLL_MAX; break;
    case c10d::ReduceOp::PREMUL_SUM: premul = true; break;
    default:
      unsupported("allreduce with ReduceOp " +
                  std::to_string(static_cast<int>(opts.reduceOp.op_)) +
                  " (SUM, AVG, PRODUCT, MIN, MAX and PREMUL_SUM are)");
  }
  if (premul)
    op = premulOp(opts.reduceOp, t, dt, *work);
  try {
    launch(work, "allreduce", [&](hcoll_request_t* req) {
      return hcoll_allreduce_async(comm_, t.data_ptr(), t.data_ptr(), t.numel(), dt, op,
                                   work->stream, req);
    });
  } catch (...) {
    if (premul)
      hcoll_op_destroy(comm_, op);
    throw;
  }
  /* Issued requests keep their own copy of a host scalar (hcoll.h). */
  if (premul)
    hcoll_op_destroy(comm_, op);
  return work;
}

/* PREMUL_SUM's factor, as torch 1.13 carries it: NCCLPreMulSumSupplement
 * (a double, or one tensor per input tensor), made by
 * dist._make_nccl_premul_sum. The factor is rounded to the tensor's dtype,
 * as ncclRedOpCreatePreMulSum takes it. */
hcoll_op_t ProcessGroupHcoll::premulOp(const c10d::ReduceOp& rop, const at::Tensor& t,
                                       hcoll_dtype_t dt, WorkHcoll& work) {
  auto* sup = static_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
  TORCH_CHECK(sup, "hcoll allreduce: PREMUL_SUM without its factor "
                   "(make it with torch.distributed._make_nccl_premul_sum)");
  at::Tensor scalar;
  if (!sup->tensor_factors.empty()) {
    TORCH_CHECK(sup->tensor_factors[0].numel() == 1,
                "hcoll allreduce: a PREMUL_SUM factor tensor must have one element");
    scalar = sup->tensor_factors[0].to(t.device(), t.scalar_type()).contiguous();
  } else {
    scalar = at::scalar_tensor(sup->double_factor, t.options().device(at::kCPU));
  }
  const bool device = scalar.is_cuda();
  if (device)
    work.keep.push_back(scalar); /* read when the GPU runs the op */
  hcoll_op_t op;
  hcoll_status_t st = hcoll_op_create_premul_sum(
      comm_, scalar.data_ptr(), dt,
      device ? HCOLL_SCALAR_DEVICE : HCOLL_SCALAR_HOST_IMMEDIATE, &op);
  check_status(st, comm_, "allreduce (PREMUL_SUM op)");
  return op;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor& t = single(tensors, "broadcast");
  TORCH_CHECK(opts.rootTensor == 0, "hcoll broadcast: rootTensor must be 0");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "hcoll broadcast: root ",
              opts.rootRank, " is not a rank of this group of ", size_);
  auto work = c10::make_intrusive<WorkHcoll>(rank_, c10d::OpType::BROADCAST, "hcoll:broadcast",
                                             tensors, comm_);
  work->stream = stream_of(t);
  /* Bytes arrive bit for bit whatever the type: any dtype goes as uint8. */
  return launch(work, "broadcast", [&](hcoll_request_t* req) {
    return hcoll_broadcast_async(comm_, t.data_ptr(), t.data_ptr(), nbytes(t), HCOLL_UINT8,
                                 static_cast<int>(opts.rootRank), work->stream, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  check_tensor(input, "_allgather_base");
  check_tensor(output, "_allgather_base");
  check_same(input, output, "_allgather_base");
  TORCH_CHECK(output.numel() == input.numel() * size_, "hcoll _allgather_base: the output has ",
              output.numel(), " elements, not ", input.numel() * size_, " (input x group size)");
  auto work = c10::make_intrusive<WorkHcoll>(rank_, c10d::OpType::_ALLGATHER_BASE,
                                             "hcoll:_all_gather_base",
                                             std::vector<at::Tensor>{output}, comm_);
  work->stream = stream_of(input);
  work->keep.push_back(input);
  return launch(work, "_allgather_base", [&](hcoll_request_t* req) {
    return hcoll_allgather_async(comm_, input.data_ptr(), output.data_ptr(), nbytes(input),
                                 HCOLL_UINT8, work->stream, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "not supported by hcoll: allgather of ", outputs.size(),
              " output lists per process (one only)");
  std::vector<at::Tensor>& outs = outputs[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == size_, "hcoll allgather: ", outs.size(),
              " output tensors for a group of ", size_);
  for (const auto& o : outs) {
    TORCH_CHECK(o.numel() == in.numel(), "hcoll allgather: an output tensor has ", o.numel(),
                " elements, the input ", in.numel());
    check_same(in, o, "allgather");
  }
  at::Tensor flat = at::empty({in.numel() * size_}, in.options());
  auto work = c10::make_intrusive<WorkHcoll>(rank_, c10d::OpType::ALLGATHER, "hcoll:all_gather",
                                             outs, comm_);
  work->stream = stream_of(in);
  work->keep = {in, flat};
  auto copy_out = [flat, outs]() mutable {
    for (size_t r = 0; r < outs.size(); r++)
      outs[r].view({-1}).copy_(flat.narrow(0, r * outs[r].numel(), outs[r].numel()));
  };
  if (!in.is_cuda())
    work->on_success = copy_out;
  launch(work, "allgather", [&](hcoll_request_t* req) {
    return hcoll_allgather_async(comm_, in.data_ptr(), flat.data_ptr(), nbytes(in), HCOLL_UINT8,
                                 work->stream, req);
  });
  /* CUDA: the copies go on the same stream, after the all-gather. */
  if (in.is_cuda())
    copy_out();
  return work;
}

static hcoll_op_t plain_op(const c10d::ReduceOp& rop, const char* what) {
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: return HCOLL_SUM;
    case c10d::ReduceOp::AVG: return HCOLL_AVG;
    case c10d::ReduceOp::PRODUCT: return HCOLL_PROD;
    case c10d::ReduceOp::MIN: return HCOLL_MIN;
    case c10d::ReduceOp::MAX: return HCOLL_MAX;
    default:
      unsupported(std::string(what) + " with ReduceOp " +
                  std::to_string(static_cast<int>(rop.op_)) +
                  " (SUM, AVG, PRODUCT, MIN and MAX are)");
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::reduceScatterFlat(
    at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& rop, c10d::OpType type,
    const char* what) {
  const hcoll_dtype_t dt = reduce_dtype(output, what);
  const hcoll_op_t op = plain_op(rop, what);
  auto work = c10::make_intrusive<WorkHcoll>(rank_, type, what, std::vector<at::Tensor>{output},
                                             comm_);
  work->stream = stream_of(output);
  work->keep.push_back(input);
  return launch(work, what, [&](hcoll_request_t* req) {
    return hcoll_reduce_scatter_async(comm_, input.data_ptr(), output.data_ptr(), output.numel(),
                                      dt, op, work->stream, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor(input, "_reduce_scatter_base");
  check_tensor(output, "_reduce_scatter_base");
  check_same(input, output, "_reduce_scatter_base");
  TORCH_CHECK(input.numel() == output.numel() * size_, "hcoll _reduce_scatter_base: the input has ",
              input.numel(), " elements, not ", output.numel() * size_, " (output x group size)");
  return reduceScatterFlat(output, input, opts.reduceOp, c10d::OpType::_REDUCE_SCATTER_BASE,
                           "_reduce_scatter_base");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "not supported by hcoll: reduce_scatter of ", inputs.size(),
              " input lists per process (one only)");
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == size_, "hcoll reduce_scatter: ",
              inputs[0].size(), " input tensors for a group of ", size_);
  std::vector<at::Tensor> flat_parts;
  for (const auto& in : inputs[0]) {
    TORCH_CHECK(in.numel() == out.numel(), "hcoll reduce_scatter: an input tensor has ",
                in.numel(), " elements, the output ", out.numel());
    check_same(in, out, "reduce_scatter");
    flat_parts.push_back(in.reshape({-1}));
  }
  /* One contiguous send buffer, block r for rank r (on CUDA the copy is
   * on the current stream, before the call). */
  at::Tensor flat = at::cat(flat_parts);
  return reduceScatterFlat(out, flat, opts.reduceOp, c10d::OpType::REDUCE_SCATTER,
                           "reduce_scatter");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::barrier(const c10d::BarrierOptions&) {
  auto work = c10::make_intrusive<WorkHcoll>(rank_, c10d::OpType::BARRIER, "hcoll:barrier",
                                             std::vector<at::Tensor>{}, comm_);
  return launch(work, "barrier",
                [&](hcoll_request_t* req) { return hcoll_barrier_async(comm_, req); });
}

/* ---- not supported ----------------------------------------------------- */

c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::allreduce_coalesced(
    std::vector<at::Tensor>&, const c10d::AllreduceCoalescedOptions&) {
  unsupported("allreduce_coalesced");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::reduce(std::vector<at::Tensor>&,
                                                         const c10d::ReduceOptions&) {
  unsupported("reduce");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
    const c10d::AllgatherOptions&) {
  unsupported("allgather_coalesced");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::gather(std::vector<std::vector<at::Tensor>>&,
                                                         std::vector<at::Tensor>&,
                                                         const c10d::GatherOptions&) {
  unsupported("gather");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::scatter(std::vector<at::Tensor>&,
                                                          std::vector<std::vector<at::Tensor>>&,
                                                          const c10d::ScatterOptions&) {
  unsupported("scatter");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::alltoall_base(at::Tensor&, at::Tensor&,
                                                                std::vector<int64_t>&,
                                                                std::vector<int64_t>&,
                                                                const c10d::AllToAllOptions&) {
  unsupported("alltoall_base");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::alltoall(std::vector<at::Tensor>&,
                                                           std::vector<at::Tensor>&,
                                                           const c10d::AllToAllOptions&) {
  unsupported("alltoall");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::send(std::vector<at::Tensor>&, int, int) {
  unsupported("send");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::recv(std::vector<at::Tensor>&, int, int) {
  unsupported("recv");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupHcoll::recvAnysource(std::vector<at::Tensor>&, int) {
  unsupported("recvAnysource");
}

}  // namespace hcoll_torch
