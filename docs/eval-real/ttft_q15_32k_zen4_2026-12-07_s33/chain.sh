cd /work/scratch/g33
M=/root/.cache/dhsa/models/qwen2.5-coder-1.5b-instruct.gguf
run() { echo "== $1 start $(date -u +%H:%M:%S)"; ./$1 bench model -m $M --lengths 32768 --attn dhsa --decode 16 --threads 2 --kv f16 2>&1; echo "== $1 end $(date -u +%H:%M:%S)"; }
run dhsa_k4 > ttft/r1_new.log
run dhsa > ttft/r2_old.log
run dhsa_k4 > ttft/r3_new.log
run dhsa > ttft/r4_old.log
echo "build start $(date -u +%H:%M:%S)" > ttft/llama_build.log
cd /work/peers && rm -rf llama_cpp_python-0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp && cmake -B build -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF >> /work/scratch/g33/ttft/llama_build.log 2>&1 && cmake --build build -j2 --target llama-bench >> /work/scratch/g33/ttft/llama_build.log 2>&1
echo "build end $(date -u +%H:%M:%S) rc $?" >> /work/scratch/g33/ttft/llama_build.log
cd /work/scratch/g33
echo "== llama start $(date -u +%H:%M:%S)" > ttft/llama_faoff.log
/work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench -m $M -t 2 -p 32768 -n 0 -fa off -ctk f16 -ctv f16 -r 1 --no-warmup -o json >> ttft/llama_faoff.log 2>&1
echo "== llama end $(date -u +%H:%M:%S)" >> ttft/llama_faoff.log
run dhsa_k4 > ttft/r5_new.log
echo done > ttft/DONE
