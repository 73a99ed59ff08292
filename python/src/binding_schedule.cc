// sparsekv._core: StepChoice, ScheduleStats and StepSchedule (include/sparsekv/step_schedule.h).
//
// The engine's attention is a Python callable, attend(layer, first, rows, stream), called while
// run_layer runs (so under a graph capture it is captured too): it enqueues attention of `layer`
// over batch rows [first, first + rows) on `stream`, an int (the cudaStream_t given to run_layer;
// 0 on the CPU backend). An exception it raises ends run_layer with that same exception; the step
// stays open (the layer's copies are enqueued), to go on or to end with abort_step.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "binding_util.h"
#include "sparsekv/manager.h"
#include "sparsekv/step_schedule.h"

namespace sparsekv {
namespace {

// A StepChoice argument: a StepChoice or the text StepChoice.__str__ writes ("chunks16").
StepChoice ChoiceOf(const py::handle& value) {
  if (py::isinstance<py::str>(value)) return Check(ParseStepChoice(value.cast<std::string>()));
  return value.cast<StepChoice>();
}

class PySchedule {
 public:
  PySchedule(const py::object& manager, const py::object& fixed, const py::object& candidates,
             int32_t trials, bool fixed_yields_to_resident)
      : target_(ManagerOf(manager)) {
    ScheduleOptions options;
    if (!fixed.is_none()) options.fixed = ChoiceOf(fixed);
    if (!candidates.is_none()) {
      for (const py::handle c : candidates) options.candidates.push_back(ChoiceOf(c));
    }
    options.trials = trials;
    options.fixed_yields_to_resident = fixed_yields_to_resident;
    schedule_ = Check(StepSchedule::Create(*target_.manager, options));
  }

  void PlanStep(const std::vector<PyRequestId>& batch, const py::object& token_ids,
                const py::object& stream) {
    const std::vector<RequestId> ids = RequestIds(batch);
    const StreamHandle s = Stream(stream);
    if (token_ids.is_none()) {
      Check(schedule_->PlanStep(ids, s));
    } else {
      const auto tokens = token_ids.cast<std::vector<int32_t>>();
      Check(schedule_->PlanStep(ids, tokens, s));
    }
  }

  // new_rows [>= batch, row_stride] bytes; topk int32 [>= batch, >= top_k] (None for a layer
  // that shares its group's top-k); slots int32 [>= batch, top_k], written; new_keys as
  // SparseKVCacheManager.append_token's.
  void RunLayer(int32_t layer, const py::object& new_rows, const py::object& topk,
                const py::object& slots, const py::function& attend, const py::object& new_keys,
                const py::object& stream) {
    const SparseKVCacheManager& m = *target_.manager;
    const PyBackend& backend = *target_.backend;
    LayerWork work;
    work.new_rows = CheckNewRows(new_rows, m, layer, "run_layer", backend).data;
    work.new_keys = CheckNewKeys(new_keys, m, backend);
    if (!topk.is_none()) {
      const TensorArg t = CheckTopK(topk, "topk", m.options().top_k, m, backend);
      work.topk = static_cast<const int32_t*>(t.data);
      work.topk_stride = static_cast<int32_t>(t.shape[1]);
    }
    work.slots = static_cast<int32_t*>(CheckSlots(slots, "slots", m, backend).data);

    // The callable's exception, kept to be raised again once run_layer has returned.
    std::optional<py::error_already_set> raised;
    const AttendFn attend_fn = [&](int32_t l, int32_t first, int32_t rows, StreamHandle s) {
      try {
        attend(l, first, rows, reinterpret_cast<uintptr_t>(s));
        return Status::Ok();
      } catch (py::error_already_set& e) {
        raised.emplace(std::move(e));
        return Internal("the attention callable raised an exception");
      }
    };
    const Status status = schedule_->RunLayer(layer, work, attend_fn, Stream(stream));
    if (raised.has_value()) throw std::move(*raised);
    Check(status);
  }

  void FinishStep(const py::object& stream) { Check(schedule_->FinishStep(Stream(stream))); }
  void AbortStep(const py::object& stream) { Check(schedule_->AbortStep(Stream(stream))); }
  void FinishReplayedStep(double seconds) { Check(schedule_->FinishReplayedStep(seconds)); }

  const StepChoice& choice() const { return schedule_->choice(); }
  const std::string& reason() const { return schedule_->reason(); }
  ScheduleStats stats() const { return schedule_->stats(); }

 private:
  StreamHandle Stream(const py::object& stream) {
    return target_.streams->Resolve(stream, *target_.backend);
  }

  ManagerRef target_;
  std::unique_ptr<StepSchedule> schedule_;
};

}  // namespace

void RegisterSchedule(py::module_& m) {
  py::class_<StepChoice>(m, "StepChoice",
                         "How a step runs: the cross-layer prefetch on or off, the planned copy "
                         "on or off, and the batch rows of each attention slice (0: each layer "
                         "copied whole first).")
      .def(py::init([](bool crosslayer_prefetch, int32_t chunk_rows, int32_t blocks, bool planned,
                       int32_t planned_blocks) {
             return StepChoice{crosslayer_prefetch, chunk_rows, blocks, planned, planned_blocks};
           }),
           py::arg("crosslayer_prefetch") = false, py::arg("chunk_rows") = 0,
           py::arg("prefetch_copy_blocks") = 0, py::arg("planned_copy") = false,
           py::arg("planned_copy_blocks") = 0,
           "A choice; chunk_rows a multiple of CacheOptions.copy_chunk_rows (0: none); "
           "prefetch_copy_blocks the prefetch's copy grid (0: the options'); planned_copy_blocks "
           "the planned copy's grid (0: the options' copy_blocks).")
      .def_static(
          "parse", [](const std::string& text) { return Check(ParseStepChoice(text)); },
          py::arg("text"),
          "The choice str() names: 'serial', 'prefetch', 'prefetch:16' (16 copy blocks), "
          "'chunks16', 'prefetch:16+chunks16', 'planned', 'planned:16+chunks16', "
          "'prefetch:16+planned:16+chunks16', 'resident'.")
      .def_readwrite("crosslayer_prefetch", &StepChoice::crosslayer_prefetch,
                     "The next index group's rows are prefetched on a side stream.")
      .def_readwrite("chunk_rows", &StepChoice::chunk_rows,
                     "Batch rows per attention slice, fed as their copies land (0: none).")
      .def_readwrite("prefetch_copy_blocks", &StepChoice::prefetch_copy_blocks,
                     "Thread blocks of the prefetch's copies (0: the options' grid).")
      .def_readwrite("planned_copy", &StepChoice::planned_copy,
                     "Every layer of an index group is copied on a side stream right after the "
                     "group's resolve; each layer's attention waits for its own copy.")
      .def_readwrite("planned_copy_blocks", &StepChoice::planned_copy_blocks,
                     "Thread blocks of the planned copies (0: the options' copy_blocks).")
      .def_readonly("resident", &StepChoice::resident,
                    "Every request of the step is resident: no miss copy is enqueued (the "
                    "schedule's own choice for such steps; it cannot be fixed or measured).")
      .def("__str__", &StepChoice::ToString)
      .def("__repr__",
           [](const StepChoice& c) { return "sparsekv.StepChoice('" + c.ToString() + "')"; })
      .def("__eq__", [](const StepChoice& a, const StepChoice& b) { return a == b; })
      .def("__hash__", [](const StepChoice& c) { return py::hash(py::str(c.ToString())); });

  m.def("allowed_choices", &AllowedChoices, py::arg("options"),
        "The StepChoices a manager's options allow, serial first.");

  py::class_<ScheduleStats>(m, "ScheduleStats", "What a StepSchedule did since it was created.")
      .def_readonly("steps", &ScheduleStats::steps, "Steps planned.")
      .def_readonly("calibration_steps", &ScheduleStats::calibration_steps,
                    "Of those, steps that measured a candidate.")
      .def_readonly("steps_by_choice", &ScheduleStats::steps_by_choice, "str(StepChoice) -> steps.")
      .def_readonly("last_choice", &ScheduleStats::last_choice,
                    "The StepChoice of the last planned step.")
      .def_readonly("last_reason", &ScheduleStats::last_reason,
                    "Why the last planned step runs in last_choice.");

  const py::arg_v no_stream = py::arg("stream") = py::none();
  py::class_<PySchedule>(m, "StepSchedule",
                         "The run phase of a decode step in the schedule it measures and chooses "
                         "(include/sparsekv/step_schedule.h). Keeps its manager alive.")
      .def(py::init<const py::object&, const py::object&, const py::object&, int32_t, bool>(),
           py::arg("manager"), py::arg("fixed") = py::none(), py::arg("candidates") = py::none(),
           py::arg("trials") = 3, py::arg("fixed_yields_to_resident") = false,
           py::keep_alive<1, 2>(),
           "A schedule over `manager`. fixed: a StepChoice (or its text) for every step; "
           "candidates: the choices it measures (default: allowed_choices); trials: timed steps "
           "per candidate and step shape, in [1, 64]; fixed_yields_to_resident: with fixed, a "
           "step in which nothing can miss (every request resident) runs in StepChoice.resident "
           "instead (key captured graphs by choice then). InvalidArgumentError for a choice the "
           "manager's options do not allow.")
      .def("plan_step", &PySchedule::PlanStep, py::arg("batch"), py::arg("token_ids") = py::none(),
           no_stream,
           "SparseKVCacheManager.plan_step, then the choice for the step (choice, reason).")
      .def("run_layer", &PySchedule::RunLayer, py::arg("layer"), py::arg("new_rows"),
           py::arg("topk"), py::arg("slots"), py::arg("attend"), py::arg("new_keys") = py::none(),
           no_stream,
           "Layer `layer`'s run phase: appends new_rows ([>= batch, row_stride] bytes), resolves "
           "topk (int32 [>= batch, >= top_k]; None for a layer that shares its group's top-k) "
           "into slots (int32 [>= batch, top_k]), copies the misses in the step's choice and "
           "calls attend(layer, first, rows, stream) for slices of the batch once their rows "
           "are in; attend enqueues the engine's attention on `stream` (an int). Layers in "
           "order, each once.")
      .def("finish_step", &PySchedule::FinishStep, no_stream,
           "Joins the schedule's streams into `stream` and ends the step.")
      .def("abort_step", &PySchedule::AbortStep, no_stream,
           "Ends the open step without the engine (after run_layer raised, typically): the "
           "manager's remaining calls with zero rows and an all-padding top-k, no attention, "
           "then the step's end. Nothing stored before the step changes; the step's token stays "
           "in its requests' histories, zero in the layers run_layer did not append, so an "
           "engine that drops the step's output releases them. FailedPreconditionError outside "
           "a step or while the stream captures a graph.")
      .def("finish_replayed_step", &PySchedule::FinishReplayedStep, py::arg("seconds") = -1.0,
           "After replaying a step captured through this schedule: closes it, and `seconds` "
           "(the replay's time; < 0: not measured) counts for the choice.")
      .def_property_readonly("choice", &PySchedule::choice, "The planned step's StepChoice.")
      .def_property_readonly("reason", &PySchedule::reason, "Why the step runs in that choice.")
      .def("stats", &PySchedule::stats, "ScheduleStats.");
}

}  // namespace sparsekv
