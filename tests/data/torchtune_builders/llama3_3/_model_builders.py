from torchtune.models.llama3_1._model_builders import llama3_1_70b, lora_llama3_1_70b, qlora_llama3_1_70b
llama3_3_70b = llama3_1_70b
lora_llama3_3_70b = lora_llama3_1_70b
qlora_llama3_3_70b = qlora_llama3_1_70b
