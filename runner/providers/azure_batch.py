"""Azure OpenAI's Batch API through the openai SDK's Azure client: OpenAI's Files and Batches under the resource
(``/openai/files``, ``/openai/batches``, with ``api-version``), so :class:`~runner.providers.openai_batch.OpenAIBatches`
does the work; only the endpoint differs. A line's ``url`` and the batch's ``endpoint`` are ``/chat/completions``
and its body's ``model`` is the deployment, which must be a Global-Batch or Data-Zone-Batch deployment
(https://learn.microsoft.com/azure/ai-services/openai/how-to/batch, "Format your input file").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from .openai_batch import OpenAIBatches

if TYPE_CHECKING:
    from .azure_openai import AzureOpenAIProvider


class AzureBatches(OpenAIBatches):
    """The Batch API of an :class:`~runner.providers.azure_openai.AzureOpenAIProvider`."""

    provider: AzureOpenAIProvider
    #: the batch's endpoint and every line's url (Azure's batch how-to, above)
    endpoint: ClassVar[str] = "/chat/completions"
