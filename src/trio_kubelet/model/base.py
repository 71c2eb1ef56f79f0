"""Common base for Kubernetes object models: camelCase aliases, unknown fields kept."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class KubeModel(BaseModel):
    """A Kubernetes API object or fragment.

    Fields are snake_case in Python and camelCase on the wire. Unknown fields are
    kept (``extra="allow"``) so that a manifest written for a newer Kubernetes
    round-trips through the agent without losing anything.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        frozen=False,
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the API server would serialise it (camelCase, no nulls)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
