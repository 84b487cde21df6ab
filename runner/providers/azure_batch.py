"""Azure OpenAI's Batch API through the openai SDK's Azure client: OpenAI's Files and Batches under the resource
(``/openai/files``, ``/openai/batches``, with ``api-version``), so :class:`~runner.providers.openai_batch.OpenAIBatches`
does the work; only the endpoint differs. A line's ``url`` and the batch's ``endpoint`` are ``/chat/completions``
and its body's ``model`` is the deployment, which must be a Global-Batch or Data-Zone-Batch deployment
(https://learn.microsoft.com/azure/ai-services/openai/how-to/batch, "Format your input file").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ._batch_common import check_lines, safe_label
from .batching import BatchLine
from .openai_batch import _METADATA_VALUE, OpenAIBatches

if TYPE_CHECKING:
    from .azure_openai import AzureOpenAIProvider

#: the batch endpoint and every line's url (Azure's batch how-to, above)
ENDPOINT = "/chat/completions"


class AzureBatches(OpenAIBatches):
    """The Batch API of an :class:`~runner.providers.azure_openai.AzureOpenAIProvider`."""

    provider: AzureOpenAIProvider

    def input_file(self, model: str, lines: list[BatchLine]) -> bytes:
        body = self.provider.request_body
        return "".join(json.dumps({"custom_id": line.custom_id, "method": "POST", "url": ENDPOINT,
                                   "body": body(model, line.messages, line.params)},
                                  ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines).encode()

    async def submit(self, model: str, lines: list[BatchLine], *, label: str) -> str:
        check_lines(self.where, lines)
        data = self.input_file(model, lines)
        metadata = {"runner": safe_label(label, self.provider, _METADATA_VALUE)}
        with self.errors():
            upload = await self.client.files.create(file=("batch-input.jsonl", data), purpose="batch")
            batch = await self.client.batches.create(input_file_id=upload.id, endpoint=ENDPOINT,
                                                     completion_window="24h", metadata=metadata)
        return str(batch.id)
