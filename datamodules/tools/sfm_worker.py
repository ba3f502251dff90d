"""The pycolmap stages of structure-from-motion, run in a child process of ``datamodules.tools.sfm``.

Why a child process: pycolmap installs glog's failure signal handler for SIGTERM when it is
imported (a C++ stack dump, and once in seven tries a hang inside the handler), and its native
stages hold the interpreter for seconds, so Python's own handlers run late. The parent waits for
this process and, on Ctrl-C or SIGTERM, kills it (SIGKILL: no handler runs) and removes its work
folder; the child dies with its parent too (``PR_SET_PDEATHSIG``) and has its own session, so the
terminal's Ctrl-C reaches the parent only.

Run as ``python sfm_worker.py SPEC.json`` (by file path: it imports nothing of the project, nor
torch, so it starts in a fraction of a second). ``SPEC.json`` holds ``folder``, ``names``,
``work``, ``settings`` (``SfmSettings`` as a dict), ``matching`` and ``verbose``. On success it
writes ``work/entry/sparse`` (COLMAP text) and ``work/entry/worker.json`` (what
``SfmResult`` needs) and exits 0; when fewer than two images register it writes
``work/error.json`` (``{"registered": N}``) and exits 3.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

EXIT_TOO_FEW = 3


class Stages:
    """One line per stage on stderr (``sfm: features: done in 2.4 s``), and the times.

    With ``estimates`` (each stage's estimated seconds, ``models.core.budget.sfm_stage_seconds``,
    from the parent), each stage's line also says how long the stages left take: their estimate
    scaled by how long the stages done took against theirs (the machine's speed and load, measured
    on the spot): ``sfm: features: done in 9.3 s; matching and mapping: about 41 s more (the stages
    so far took 2.2x their estimate)``. ``clock``: seconds (a test's fake clock)."""

    def __init__(
        self, verbose: bool, estimates: dict[str, float] | None = None, clock=time.perf_counter
    ) -> None:
        self.verbose = verbose
        self.estimates = dict(estimates or {})
        self.clock = clock
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str, what: str) -> Iterator[None]:
        if self.verbose:
            print(f"sfm: {name}: {what} ...", file=sys.stderr, flush=True)
        start = self.clock()
        yield
        self.times[name] = round(self.clock() - start, 3)
        if self.verbose:
            line = f"sfm: {name}: done in {self.times[name]:.1f} s{self.rest()}"
            print(line, file=sys.stderr, flush=True)

    def rest(self) -> str:
        """``; matching and mapping: about 41 s more (...)``, or nothing (no estimates, no
        stage left, or under 5 s left)."""
        left = [stage for stage in self.estimates if stage not in self.times]
        done = [stage for stage in self.estimates if stage in self.times]
        said = sum(self.estimates[stage] for stage in done)
        if not left or not done or said <= 0:
            return ""
        factor = sum(self.times[stage] for stage in done) / said
        seconds = factor * sum(self.estimates[stage] for stage in left)
        if seconds < 5:
            return ""
        return (
            f"; {' and '.join(left)}: about {seconds:.0f} s more (the stages so far took "
            f"{factor:.1f}x their estimate)"
        )


@contextlib.contextmanager
def quiet_colmap(verbose: int) -> Iterator[None]:
    """COLMAP's glog lines (hundreds per run) only with ``verbose=2``."""
    import pycolmap

    if verbose >= 2:
        yield
        return
    old = pycolmap.logging.minloglevel
    pycolmap.logging.minloglevel = 2  # errors only
    try:
        yield
    finally:
        pycolmap.logging.minloglevel = old


def run_colmap(
    folder: Path,
    names: list[str],
    sizes: list[tuple[int, int]],
    work: Path,
    settings: dict,
    matching: str,
    stages: Stages,
    verbose: int,
):
    """Features, matching and mapping in ``work``; returns the reconstructions (id → model)."""
    import pycolmap

    pycolmap.set_random_seed(settings["seed"])
    database = work / "database.db"
    single = settings["single_camera"]
    if single is None:
        single = len(set(sizes)) == 1
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = settings["camera_model"]
    if settings["fov"] is not None:
        width, height = sizes[0]
        focal = 0.5 * width / math.tan(math.radians(float(settings["fov"])) / 2)
        camera = pycolmap.Camera.create_from_model_name(
            1, settings["camera_model"], focal, width, height
        )
        reader.camera_params = ",".join(f"{p:.10g}" for p in camera.params)
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = settings["num_threads"]
    extraction.max_image_size = settings["max_image_size"]
    extraction.sift.max_num_features = settings["max_num_features"]
    mode = pycolmap.CameraMode.SINGLE if single else pycolmap.CameraMode.AUTO
    with stages("features", f"SIFT on {len(names)} images"):
        pycolmap.extract_features(
            database,
            folder,
            image_names=names,
            camera_mode=mode,
            reader_options=reader,
            extraction_options=extraction,
            device=pycolmap.Device.cpu,
        )
    matcher = pycolmap.FeatureMatchingOptions()
    matcher.num_threads = settings["num_threads"]
    verification = pycolmap.TwoViewGeometryOptions()
    verification.ransac.random_seed = settings["seed"]
    pairs = len(names) * (len(names) - 1) // 2
    if matching == "exhaustive":
        with stages("matching", f"exhaustive, {pairs} pairs"):
            pycolmap.match_exhaustive(
                database,
                matching_options=matcher,
                verification_options=verification,
                device=pycolmap.Device.cpu,
            )
    else:
        pairing = pycolmap.SequentialPairingOptions()
        pairing.overlap = settings["overlap"]
        pairing.num_threads = settings["num_threads"]
        with stages("matching", f"sequential, each image with its next {settings['overlap']}"):
            pycolmap.match_sequential(
                database,
                matching_options=matcher,
                pairing_options=pairing,
                verification_options=verification,
                device=pycolmap.Device.cpu,
            )
    options = pycolmap.IncrementalPipelineOptions()
    options.num_threads = settings["num_threads"]
    options.random_seed = settings["seed"]
    options.min_model_size = 2
    options.ba_refine_focal_length = settings["refine_focal"]
    options.mapper.abs_pose_refine_focal_length = settings["refine_focal"]
    # Forward-moving video (a drone flying on) has no initial pair under COLMAP's default 0.95
    # (measured: the 8 drone frames do not initialise); allow forward motion.
    options.mapper.init_max_forward_motion = 0.999
    (work / "models").mkdir()
    bar = None
    if verbose:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(names), desc="sfm: mapping", unit="image", leave=False, disable=None)

    def next_image() -> None:
        if bar is not None:
            bar.update(1)

    try:
        with stages("mapping", "incremental mapping"):
            models = pycolmap.incremental_mapping(
                database, folder, work / "models", options, next_image_callback=next_image
            )
    finally:
        if bar is not None:
            bar.close()
    return models


def largest(models: dict) -> object | None:
    """The reconstruction with the most registered images (then the most points)."""
    best = None
    for model in models.values():
        key = (model.num_reg_images(), model.num_points3D())
        if best is None or key > (best.num_reg_images(), best.num_points3D()):
            best = model
    return best


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; elsewhere the parent's kill suffices)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(spec_path: str) -> int:
    _die_with_parent()
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    folder, work = Path(spec["folder"]), Path(spec["work"])
    names, settings, verbose = spec["names"], spec["settings"], int(spec["verbose"])
    sizes = [tuple(size) for size in spec["sizes"]]
    stages = Stages(bool(verbose), spec.get("stage_seconds"))
    with quiet_colmap(verbose):
        models = run_colmap(folder, names, sizes, work, settings, spec["matching"], stages, verbose)
    best = largest(models)
    count = best.num_reg_images() if best is not None else 0
    if count < 2:
        (work / "error.json").write_text(json.dumps({"registered": count}), encoding="utf-8")
        return EXIT_TOO_FEW
    entry = work / "entry"
    (entry / "sparse").mkdir(parents=True)
    best.write_text(str(entry / "sparse"))
    posed = {image.name for image in best.images.values() if image.has_pose}
    info = {
        "posed": sorted(posed),
        "num_points3d": int(best.num_points3D()),
        "mean_reprojection_error": float(best.compute_mean_reprojection_error()),
        "focal_px": [float(best.cameras[c].params[0]) for c in sorted(best.cameras)],
        "timings_s": stages.times,
    }
    (entry / "worker.json").write_text(json.dumps(info), encoding="utf-8")
    return 0


EXIT_FAILED = 4  # pycolmap (or the files it reads) failed: its one line is in failure.json


def _main_reporting(spec_path: str) -> int:
    """``main``, with a failure written as one line for the parent (no traceback on stderr)."""
    try:
        return main(spec_path)
    except Exception as error:  # pycolmap's checks raise ValueError/RuntimeError with one line
        lines = str(error).strip().splitlines() or [type(error).__name__]
        try:
            failure = Path(spec_path).with_name("failure.json")
            failure.write_text(json.dumps({"message": lines[0]}), encoding="utf-8")
        except OSError:  # the work folder itself went away: the parent sees that
            pass
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(_main_reporting(sys.argv[1]))
