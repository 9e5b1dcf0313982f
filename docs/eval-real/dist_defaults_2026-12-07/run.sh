B=/work/wt/lead/build/dhsa
M=/root/.cache/dhsa/models/qwen2.5-coder-0.5b-instruct-q8_0.gguf
MP="env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --oversubscribe"
C="run -m $M -f needle.txt -n 10 --temp 0 --ids --ctx 4096 --kv f16 --attn dhsa --exact"
cp $B ./dhsa
B=./dhsa
( time $B $C -t 2 --logits-out one.f32 -v ) > one.out 2> one.err
( time $B $C -t 2 --carry 0 --exact-rows 0 --logits-out off.f32 ) > off.out 2> off.err
( time $MP -np 2 $B $C -t 1 --logits-out np2.f32 -v ) > np2.out 2> np2.err
( time $MP -np 2 $B $C -t 1 --dist-stripe 512 --logits-out np2s.f32 -v ) > np2s.out 2> np2s.err
echo done > DONE
