"""What every run on this machine's stack uses, whoever starts it (``Trainer.fit``, the demo, the learning bench):
the local broker and store (:mod:`.stack`), the supervisor of the run's processes (:mod:`.procs`), the run's
namespace (:mod:`.scope`), the live view of its topics and the task feeder (:mod:`.live`), and the evaluation
of a version through its own server (:mod:`.evaluation`). The demo and the public API stand on it; it imports
neither."""
