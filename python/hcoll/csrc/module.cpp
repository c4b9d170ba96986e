/* Python side of the "hcoll" c10d backend: the ProcessGroupHcoll class (a
 * torch.distributed ProcessGroup) and the unique id maker. hcoll/_c10d.py
 * builds this, carries the id through the c10d store and registers the
 * backend. */
#include <torch/csrc/utils/pybind.h>

#include "process_group_hcoll.hpp"

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  /* The base class lives in torch's module; pybind needs it imported. */
  py::module::import("torch.distributed");
  py::class_<hcoll_torch::ProcessGroupHcoll, c10d::ProcessGroup,
             c10::intrusive_ptr<hcoll_torch::ProcessGroupHcoll>>(m, "ProcessGroupHcoll")
      .def(py::init([](py::bytes uid, int rank, int size, int64_t op_timeout_ms, int rail) {
             std::string id = uid;
             py::gil_scoped_release nogil; /* init blocks until every rank joins */
             return c10::make_intrusive<hcoll_torch::ProcessGroupHcoll>(id, rank, size,
                                                                        op_timeout_ms, rail);
           }),
           py::arg("unique_id"), py::arg("rank"), py::arg("size"),
           py::arg("op_timeout_ms") = -1, py::arg("rail") = -1,
           "Join the hcoll communicator whose id rank 0 made (blocks until all join).")
      .def_property_readonly("op_timeout_ms", &hcoll_torch::ProcessGroupHcoll::opTimeoutMs)
      .def("_comm_handle", [](const hcoll_torch::ProcessGroupHcoll& pg) {
        return reinterpret_cast<uintptr_t>(pg.comm());
      });
  m.def("unique_id", []() { return py::bytes(hcoll_torch::makeUniqueId()); },
        "hcoll_get_unique_id, as bytes (rank 0 only).");
  m.attr("UNIQUE_ID_BYTES") = HCOLL_UNIQUE_ID_BYTES;
}
