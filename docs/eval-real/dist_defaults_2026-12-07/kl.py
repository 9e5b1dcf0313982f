import sys, array, math
V=151936
def rd(p):
    a=array.array('f'); a.frombytes(open(p,'rb').read()); return a
def lsm(x):
    m=max(x); s=sum(math.exp(v-m) for v in x); l=m+math.log(s); return [v-l for v in x]
A=rd(sys.argv[1])
for f in sys.argv[2:]:
    B=rd(f); kls=[]; top=0
    for s in range(len(A)//V):
        a=lsm(A[s*V:(s+1)*V]); b=lsm(B[s*V:(s+1)*V])
        kls.append(sum(math.exp(p)*(p-q) for p,q in zip(a,b)))
        top+= a.index(max(a))==b.index(max(b))
    print(f, "KL mean %.2e max %.2e top1 %d/%d"%(sum(kls)/len(kls), max(kls), top, len(kls)))
