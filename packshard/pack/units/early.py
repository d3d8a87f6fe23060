"""The workers' fork server, started before the driver imports the pipeline; inputs listed once.

``pack``'s local workers are forked from a server that imports the map module and loads the
tokenizer, the template and the fast encoder once
(:func:`~packshard.pack.units.map.warm_worker`): about 0.9 s before the first unit can be
mapped.  The command line starts it as soon as the options are read
(:func:`~packshard.engine.startup.prestart`, whose notes draw the timeline), so that it and
the driver's own imports run side by side on two cores.  This module imports neither the
pipeline nor the map module: only the options, the input list and the engine's starter.  One
worker, Ray, or inputs that ``--workers auto`` sizes to one worker start nothing.

The inputs are listed here once (:func:`list_inputs`) and the listing is handed to the
pipeline: listing a folder of 10,000 small files, and summing their sizes, costs about
0.15 s, which a second listing in the pipeline paid again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from packshard.engine import WarmUp, prestart
from packshard.errors import PackshardError
from packshard.ingest import InputFile, expand_inputs, input_bytes
from packshard.ingest.types import SMALL_JOB_BYTES
from packshard.pack.config import PackConfig

MAP_MODULE = "packshard.pack.units.map"
WARM_FUNCTION = "warm_worker"
EARLY = ("packshard.ingest.stage.loaded", "load_early")


def warm_up(config: PackConfig) -> WarmUp:
    """Return what each worker of ``config`` runs as it starts (in the fork server, once).

    :func:`~packshard.pack.units.map.warm_worker` on the tokenizer, the template,
    ``--backend`` and whether the job is small, with
    :func:`~packshard.ingest.stage.loaded.load_early` on a thread beside the server's imports.
    """
    ingest = config.ingest
    args = (config.tokenizer, config.template, ingest.backend, ingest.small_job)
    return WarmUp(MAP_MODULE, WARM_FUNCTION, args, EARLY)


@dataclass(frozen=True, slots=True)
class ListedInputs:
    """A pack's inputs, listed once: the training files, the ``--eval`` files, their bytes.

    ``size`` is the bytes of every regular file among them
    (:func:`~packshard.ingest.read.units.input_bytes`): what ``--workers auto`` is sized by
    and what the progress bar counts to.
    """

    train: tuple[InputFile, ...]
    evals: tuple[InputFile, ...]
    size: int

    @property
    def files(self) -> list[InputFile]:
        """The training files, then the ``--eval`` files."""
        return [*self.train, *self.evals]


def list_inputs(config: PackConfig) -> ListedInputs:
    """Expand ``config``'s inputs and ``--eval`` inputs, in that order, and sum their bytes.

    Raises:
        InputError: a spec matches nothing or names what cannot be read
            (:func:`~packshard.ingest.read.inputs.expand_inputs`).

    """
    train = tuple(expand_inputs(config.inputs, fetch=False))  # store objects read by workers
    evals = tuple(expand_inputs(config.eval_inputs, fetch=False)) if config.eval_inputs else ()
    return ListedInputs(train, evals, input_bytes([*train, *evals]))


def sized_config(config: PackConfig, listed: ListedInputs) -> PackConfig:
    """Return ``config`` sized for the listed bytes: ``--workers auto`` and the small job.

    A job under :data:`~packshard.ingest.types.SMALL_JOB_BYTES` of input tries the
    fast encoder built soonest first; decided here, from the bytes alone, it reaches the fork
    server's warm-up and every unit (the number of workers does not change it).
    """
    small = listed.size < SMALL_JOB_BYTES
    ingest = config.ingest if config.ingest.small_job == small else None
    return replace(
        config,
        engine=config.engine.sized(listed.size),
        ingest=ingest or replace(config.ingest, small_job=small),
    )


def start_early(config: PackConfig) -> ListedInputs | None:
    """Start the fork server of ``config``'s local workers now (see the module notes).

    Returns the listed inputs for :func:`~packshard.pack.pipeline.pack_dataset` to reuse, or
    None when listing them failed (``pack`` lists them again and names the problem itself,
    in its order).
    """
    try:
        listed = list_inputs(config)
    except PackshardError:
        return None
    sized = sized_config(config, listed)
    prestart(sized.engine, warm_up(sized))
    return listed
