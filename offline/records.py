"""What the artifact records of the data a calibration read and which samples each step used, as
they were used (the resolved sample counts of ``offline.sizing``, not the settings' defaults)."""

from __future__ import annotations

from qpart.models.data import describe_splits
from qpart.models.sources import DataSource, FashionMnistSource
from qpart.offline.data import Sources
from qpart.offline.samples import Data
from qpart.offline.settings import CalibrationSettings
from qpart.profiles.artifacts import CalibrationData, DataRecord


def data_record(sources: Sources, data: Data, s: CalibrationSettings) -> CalibrationData:
    """The artifact's ``data``: each source's record and the samples the job took of them."""
    def record(source: DataSource) -> DataRecord:
        return DataRecord.model_validate(source.describe().model_dump(mode="json"))

    return CalibrationData(calibration=record(sources.calibration), test=record(sources.test),
                           sample_order=sources.order, fit_samples=s.fit_count,
                           check_samples=s.check_count, test_samples=len(data.test))


def splits(sources: Sources, s: CalibrationSettings) -> dict[str, object]:
    """Which samples each step used (the noise tables: the first ``noise_samples`` fit samples, never
    more than there are); with the built-in sources, also their split record."""
    use: dict[str, object] = {"calibration_use": {
        "fit": [0, s.fit_count], "check": [s.fit_count, s.fit_count + s.check_count],
        "noise_tables": [0, min(s.noise_samples, s.fit_count)]}}
    builtin = all(isinstance(x, FashionMnistSource) for x in (sources.calibration, sources.test))
    return {**describe_splits(), **use} if builtin else use
