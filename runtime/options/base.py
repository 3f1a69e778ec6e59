"""What a backend declares about its options, and the helpers the declarations share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One `accelify launch` flag: the option it sets and its click declaration."""

    option: str  # the field of the backend's options dataclass
    declarations: tuple[str, ...]  # click's parameter declarations: "--fsdp-cpu-offload"
    help: str
    dest: str = ""  # click's destination, when it is not the option's name
    click: Mapping[str, Any] = field(default_factory=dict)  # type=, is_flag=...
    #: a boolean flag that HF spells with a value (``--fsdp_activation_checkpointing true``):
    #: each such value, lower-case, and the spelling of this flag it means
    hf_values: Mapping[str, str] = field(default_factory=dict)

    @property
    def destination(self) -> str:
        return self.dest or self.option

    @property
    def name(self) -> str:
        """The flag as a user types it (the first declaration, before any ``/``)."""
        return self.declarations[0].split("/")[0]


@dataclass(frozen=True)
class HFFlag:
    """One flag of HF ``accelerate launch`` with no accelify flag of the same meaning: its value
    is either translated (``translated``: read as the HF config key of the same name, by the
    code that reads HF config files) or accepted only when it asks for what accelify does anyway
    (``accepts``, compared lower-case; a flag without a value is accepted when ``accepts`` holds
    ``""``); anything else is refused with ``refusal``, one line that says why."""

    name: str  # HF's snake_case spelling, without dashes: "fsdp_offload_params"
    refusal: str = ""
    takes_value: bool = True
    translated: bool = False
    accepts: tuple[str, ...] = ()
    help: str = ""
    short: str = ""  # "-q"

    @property
    def declarations(self) -> tuple[str, ...]:
        """Both spellings, as HF accepts them (and its short one)."""
        snake = f"--{self.name}"
        kebab = snake.replace("_", "-")
        spellings = (snake,) if kebab == snake else (snake, kebab)
        return (self.short, *spellings) if self.short else spellings

    @property
    def destination(self) -> str:
        return f"hf_{self.name}"

    def refused(self, value: object) -> str | None:
        """Why this value is refused, or None when it is accepted (or translated)."""
        if self.translated:
            return None
        text = "" if value is True else str(value).lower()
        return None if text in self.accepts else self.refusal


@dataclass(frozen=True)
class BackendOptions:
    """Everything about one backend's options, in that backend's own module: the dataclass,
    its flags, its section of an HF Accelerate config file, its checks and its questions."""

    backend: str
    options: type  # a frozen dataclass; every field None when not given
    flags: tuple[Flag, ...]
    hf_section: str  # "fsdp_config"
    #: HF section -> (options, launch settings it carries, such as accumulation steps)
    from_hf: Callable[[Mapping[str, Any]], tuple[Any, dict[str, Any]]]
    #: refuse what the options cannot do on this run (on_cpu); raises UserError
    check: Callable[[Any, bool], None]
    #: `accelify config`'s questions for this backend
    ask: Callable[[], Any]
    #: HF `accelerate launch` flags of this backend that are not among `flags`
    hf_flags: tuple[HFFlag, ...] = ()


def given(options: Any) -> dict[str, Any]:
    return {key: value for key, value in asdict(options).items() if value is not None}


def class_names(text: str) -> tuple[str, ...]:
    """``"BertLayer, Block"`` -> ``("BertLayer", "Block")``."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def parse_options(options: type[Any], values: Mapping[str, Any]) -> Any:
    """An options object from a mapping of option names (config file section, environment)."""
    names = {item.name for item in fields(options)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"unknown option {sorted(unknown)[0]!r}; expected one of {sorted(names)}")
    tuples = {item.name for item in fields(options) if "tuple" in str(item.type)}
    values = {k: tuple(v) if k in tuples and v is not None else v for k, v in values.items()}
    return options(**values)


def hf_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(f"{key}: expected true or false")
