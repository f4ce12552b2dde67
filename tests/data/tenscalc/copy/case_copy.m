% TensCalc case "copy" (opgraph fixture tests/data/tenscalc/copy/): one gradient step on a
% least-squares cost, copied back into the variables it came from.
%
%   r = A*x - b;  J = norm2(r) (= sum of squares);  g = gradient(J,x);  xn = x - a*g
%   copy_step: x <- xn and a <- 0.5*a, in one copy gateway (declareCopy with cell arrays)
%
% Run with GNU Octave 7.3 and TensCalc f127cb59; tc_setup.m (not included) puts TensCalc, its
% dependencies and small Octave compatibility shims on the path (see reference.json, generator.notes):
%   octave case_copy.m scalarized   -> scalarized.{cg,cgc,cgio,cgs}   (lib/@csparse/saveScalarized.m)
%   octave case_copy.m vectorized   -> vectorized.{cg,cgc,cgio,cgs}   (lib/@csparse/saveVectorized.m)
%   octave case_copy.m reference    -> reference_values.json: every step run by the code TensCalc
%                                      generates (csparse.compile2matlab), and plain Octave formulas
% Each mode runs in a fresh Octave process.
tc_setup;
mode=argv(){1};

Tvariable A [3,2];
Tvariable b [3];
Tvariable x [2];
Tvariable a [];
r=A*x-b;
J=norm2(r);
g=gradient(J,x);
xn=x-a*g;

code=csparse();
declareSet(code,A,'set_A');
declareSet(code,b,'set_b');
declareSet(code,x,'set_x');
declareSet(code,a,'set_a');
declareGet(code,{J,g},'get_J_g');
declareGet(code,{xn},'get_xn');
declareCopy(code,{x,a},{xn,0.5*a},'copy_step');

switch mode
  case 'scalarized'
    saveScalarized(code,'scalarized');
  case 'vectorized'
    saveVectorized(code,'vectorized');
  case 'reference'
    compile2matlab(code,'tmpcasecopy.m','',{'case copy'});
    rehash;
    obj=tmpcasecopy();
    Av=[1,-2;0.3,3;-1.7,0.25]; bv=[1;-0.6;2]; xv=[0.7;-1.3]; av=0.1;
    steps={};
    function s=setstep(name,value,shape)
      s=struct('op','set','gateway',name,'shape',shape,'value',value);
    end
    function o=out(name,value,plain,shape)
      o=struct('name',name,'shape',shape,'value',value,'max_abs_diff_vs_plain_octave',max(abs(value(:)-plain(:))));
    end
    set_A(obj,Av); steps{end+1}=setstep('set_A',Av,[3,2]);
    set_b(obj,bv); steps{end+1}=setstep('set_b',bv,3);
    set_x(obj,xv); steps{end+1}=setstep('set_x',xv,2);
    set_a(obj,av); steps{end+1}=setstep('set_a',av,zeros(1,0));
    px=xv; pa=av;  % plain Octave state
    for it=1:2
      [Jv,gv]=get_J_g(obj);
      pr=Av*px-bv; pJ=sum(pr.^2); pg=2*Av'*pr;
      steps{end+1}=struct('op','get','gateway','get_J_g','outputs',{{out('J',Jv,pJ,zeros(1,0)),out('g',gv,pg,2)}});
      xnv=get_xn(obj);
      pxn=px-pa*pg;
      steps{end+1}=struct('op','get','gateway','get_xn','outputs',{{out('xn',xnv,pxn,2)}});
      copy_step(obj);
      steps{end+1}=struct('op','copy','gateway','copy_step');
      px=pxn; pa=0.5*pa;
    end
    [Jv,gv]=get_J_g(obj);
    pr=Av*px-bv; pJ=sum(pr.^2); pg=2*Av'*pr;
    steps{end+1}=struct('op','get','gateway','get_J_g','outputs',{{out('J',Jv,pJ,zeros(1,0)),out('g',gv,pg,2)}});
    fid=fopen('reference_values.json','w');
    fprintf(fid,'%s',jsonencode(steps,'ConvertInfAndNaN',false));
    fclose(fid);
end
