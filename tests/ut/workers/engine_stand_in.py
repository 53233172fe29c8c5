"""What the workers' stand-in engines share: the checkpoint calls, recorded (``saved``, ``loaded``, ``step``)."""
import os


class RecordsCheckpoints:
    saved: list

    def save_sharded(self, path, with_optimizer):
        os.makedirs(path)  # the folder a load looks for
        self.saved.append((path, with_optimizer))

    def load_sharded(self, path, with_optimizer):
        self.loaded = (path, with_optimizer)

    def set_step(self, step):
        self.step = step

    def save(self, path):
        if path.endswith("bad"):
            raise OSError(28, "No space left on device")
        self.saved.append(path)
